"""`kvgate hash`: print vLLM's block hashes for a list of token ids, one full block per line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvgate.prefix.hashing import HASH_ALGOS, BlockHasher, LoraKey, int_form


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algo", choices=HASH_ALGOS, default="sha256", help="default sha256")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (16)")
    parser.add_argument(
        "--seed",
        default=None,
        help="the engines' PYTHONHASHSEED; omit when it is unset (seed 'vllm-none-hash')",
    )
    parser.add_argument("--cache-salt", default=None, help="the request's cache_salt")
    parser.add_argument("--lora-name", default=None, help="LoRA adapter name (with --lora-path)")
    parser.add_argument("--lora-path", default=None, help="LoRA adapter path (with --lora-name)")
    parser.add_argument(
        "--tokens-json",
        required=True,
        help="file holding a JSON list of token ids ('-' reads stdin)",
    )
    parser.add_argument(
        "--int",
        dest="int_form",
        action="store_true",
        help="print the 64-bit integers vLLM publishes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES",
    )


def read_token_ids(source: str) -> list[int]:
    """Parse a JSON list of non-negative integer token ids; ValueError says what is wrong."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {source}: {exc.strerror or exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise ValueError(f"{source} must hold a JSON list of token ids, not {type(value).__name__}")
    for index, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"token {index} is {token!r}: token ids are non-negative integers")
    return value


def run(args: argparse.Namespace) -> int:
    prog = "kvgate hash"
    if (args.lora_name is None) != (args.lora_path is None):
        print(f"{prog}: error: --lora-name and --lora-path go together", file=sys.stderr)
        return 2
    if args.block_size < 1:
        print(f"{prog}: error: --block-size must be >= 1", file=sys.stderr)
        return 2
    try:
        tokens = read_token_ids(args.tokens_json)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    lora = LoraKey(args.lora_name, args.lora_path) if args.lora_name is not None else None
    hasher = BlockHasher(args.algo, args.block_size, args.seed, cache_bytes=0)
    digests = hasher.hash_blocks(tokens, lora=lora, cache_salt=args.cache_salt)
    lines = [str(int_form(d)) if args.int_form else d.hex() for d in digests]
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0
