"""`kvgate demo`: a simulated fleet, round robin vs kvgate, side by side."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo-out", help="folder for the report and plots")


def run(args: argparse.Namespace) -> int:
    print("kvgate demo: not yet — the simulator and router are still being built.")
    return 0
