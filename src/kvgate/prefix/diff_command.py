"""`kvgate prefix diff A.json B.json`: where two request bodies stop sharing a prompt prefix."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kvgate.prefix.diff import PrefixDiff, diff_requests

PROG = "kvgate prefix diff"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    diff = actions.add_parser(
        "diff",
        help="common prefix (tokens, blocks) of two request bodies and the first differing field",
        description="Compare two /v1/chat/completions or /v1/completions request bodies.",
    )
    diff.add_argument("a", help="first request body (JSON file, e.g. the previous turn)")
    diff.add_argument("b", help="second request body (JSON file, e.g. this turn)")
    diff.add_argument(
        "--tokenizer",
        default=None,
        help="model directory with tokenizer.json (+ tokenizer_config.json); "
        "without it the comparison is approximate, in characters",
    )
    diff.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (16)")
    diff.add_argument(
        "--approx-block-chars", type=int, default=64, help="block size in approximate mode (64)"
    )
    diff.add_argument("--json", action="store_true", help="print one JSON object")


def _load(path: str) -> dict[str, Any]:
    try:
        value = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a request body (a JSON object)")
    return value


def format_diff(result: PrefixDiff) -> str:
    unit = result.unit
    lines = [
        f"common prefix: {result.common} {unit} of {result.lengths[0]} / {result.lengths[1]} "
        f"({result.common_blocks} full blocks of {result.block_size} {unit})",
        f"verdict: {result.kind}",
    ]
    field = result.field
    if field is not None:
        where = f" at char {field.char_offset}" if field.char_offset is not None else ""
        label = "first new field" if result.kind == "extends" else "first difference"
        lines.append(f"{label}: {field.path}{where}")
        if field.a_excerpt or field.b_excerpt:
            lines.append(f"  A: {field.a_excerpt!r}")
            lines.append(f"  B: {field.b_excerpt!r}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.block_size < 1 or args.approx_block_chars < 1:
        print(f"{PROG}: error: block sizes must be >= 1", file=sys.stderr)
        return 2
    try:
        a, b = _load(args.a), _load(args.b)
        requests = None
        if args.tokenizer:  # needs `tokenizers` and `jinja2` (kvgate[router])
            from kvgate.prefix.prompt import RequestTokenizer
            from kvgate.prefix.tokenizer import Tokenizer

            requests = RequestTokenizer(Tokenizer.from_dir(args.tokenizer))
        result = diff_requests(
            a,
            b,
            requests=requests,
            block_size=args.block_size,
            approx_block_chars=args.approx_block_chars,
        )
    except ValueError as exc:  # PromptError, TokenizerError, ChatTemplateError too
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
    else:
        print(format_diff(result))
    return 0
