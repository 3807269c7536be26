"""`kvgate crds`: write the generated CRD YAML (and optionally docs/crds.md), or check for drift."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvgate.api.crd_docs import crd_files, crds_markdown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="crds", help="directory for the CRD YAML (default crds)")
    parser.add_argument(
        "--docs", default=None, help="also write the Markdown reference to this file"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the files on disk differ from the generated ones",
    )
    parser.add_argument(
        "--stdout", action="store_true", help="print all CRDs as one YAML stream instead"
    )


def _expected(args: argparse.Namespace) -> dict[Path, str]:
    out = Path(args.out)
    files = {out / name: text for name, text in crd_files().items()}
    if args.docs:
        files[Path(args.docs)] = crds_markdown()
    return files


def run(args: argparse.Namespace) -> int:
    if args.stdout:
        print("---\n".join(crd_files().values()), end="")
        return 0
    expected = _expected(args)
    if args.check:
        stale = [
            path
            for path, text in expected.items()
            if not path.exists() or path.read_text(encoding="utf-8") != text
        ]
        for stale_path in stale:
            print(f"out of date: {stale_path} (run `make crds`)")
        return 1 if stale else 0
    for path, text in expected.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0
