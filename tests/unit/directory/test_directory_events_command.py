"""`kvgate events decode`: JSON per event, errors on stderr with exit 1, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from kvgate.cli import main

DATA = Path(__file__).parents[2] / "data" / "events"
MANIFEST = json.loads((DATA / "manifest.json").read_text())


def test_decode_prints_one_json_object_per_event(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(DATA / c["file"]) for c in MANIFEST]
    assert main(["events", "decode", *files]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out == [e for c in MANIFEST for e in c["events"]]


def test_malformed_payload_is_an_error_not_a_crash(tmp_path: Path) -> None:
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes((DATA / MANIFEST[0]["file"]).read_bytes()[:25])
    good = DATA / MANIFEST[0]["file"]
    proc = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "events", "decode", str(bad), str(good), str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"{bad}: truncated" in proc.stderr
    assert "none: No such file" in proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == MANIFEST[0]["events"]


def test_rejected_event_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    payload = tmp_path / "p.msgpack"
    payload.write_bytes(msgpack.packb([1.0, [{"type": "Nope"}, ["AllBlocksCleared"]]]))
    assert main(["events", "decode", str(payload)]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip() == '{"type": "AllBlocksCleared"}'
    assert "unknown_type" in captured.err


def test_an_action_is_required() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["events"])
    assert exc.value.code == 2
