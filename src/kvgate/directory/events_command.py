"""`kvgate events`: inspect vLLM KV event payloads.

`kvgate events decode FILE...` reads files that each hold one raw msgpack payload (as a ZMQ
message's last frame; `-` is stdin) and prints one JSON object per event. A payload that does not
decode, or an event in it that is rejected, is reported on stderr and makes the exit status 1;
the other files and events are still printed.
"""

from __future__ import annotations

import argparse
import json
import sys

from kvgate.directory.events import EventDecodeError, decode_batch, event_to_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    decode = actions.add_parser("decode", help="print the events of raw KV event payloads as JSON")
    decode.add_argument(
        "files", nargs="+", metavar="FILE", help="one msgpack payload each; - = stdin"
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "decode":
        return decode(args.files)
    raise AssertionError(args.action)  # argparse rejects other actions


def decode(files: list[str]) -> int:
    status = 0
    for name in files:
        try:
            if name == "-":
                payload = sys.stdin.buffer.read()
            else:
                with open(name, "rb") as f:
                    payload = f.read()
        except OSError as exc:
            print(f"kvgate events decode: {name}: {exc.strerror or exc}", file=sys.stderr)
            status = 1
            continue
        try:
            batch = decode_batch(payload)
        except EventDecodeError as exc:
            print(f"kvgate events decode: {name}: {exc}", file=sys.stderr)
            status = 1
            continue
        for event in batch.events:
            print(json.dumps(event_to_json(event)))
        for rejected in batch.rejected:
            print(f"kvgate events decode: {name}: event skipped: {rejected.reason}: "
                  f"{rejected.detail}", file=sys.stderr)  # fmt: skip
            status = 1
        if batch.unread_events:
            print(f"kvgate events decode: {name}: {batch.unread_events} events after "
                  f"{len(batch.rejected)} rejected ones not read", file=sys.stderr)  # fmt: skip
    return status
