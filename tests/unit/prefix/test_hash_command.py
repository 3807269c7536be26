"""`kvgate hash` prints vLLM's digests (checked against the vLLM-generated vectors)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.cli import main

VECTORS = json.loads(
    (Path(__file__).parents[2] / "data" / "prefix" / "hash_vectors.json").read_text()
)["cases"]


def _args(case: dict, tokens_file: Path) -> list[str]:
    args = ["hash", "--algo", case["algo"], "--block-size", str(case["block_size"])]
    args += ["--tokens-json", str(tokens_file)]
    if case["seed"] is not None:
        args += ["--seed", case["seed"]]
    if case["cache_salt"]:
        args += ["--cache-salt", case["cache_salt"]]
    if case["lora"]:
        args += ["--lora-name", case["lora"]["name"], "--lora-path", case["lora"]["path"]]
    return args


@pytest.mark.parametrize("case", VECTORS[::5])
def test_prints_vllm_digests(case, tmp_path, capsys):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(case["token_ids"]))
    assert main(_args(case, tokens)) == 0
    assert capsys.readouterr().out.split() == case["block_hashes"]
    assert main([*_args(case, tokens), "--int"]) == 0
    assert capsys.readouterr().out.split() == [str(v) for v in case["int_block_hashes"]]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        ('{"a": 1}', "JSON list"),
        ("[1, -2]", "token 1"),
        ("[1, 2.5]", "token 1"),
        ("[true]", "token 0"),
    ],
)
def test_bad_tokens_file_is_a_clear_error(content, message, tmp_path, capsys):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(content)
    assert main(["hash", "--tokens-json", str(tokens)]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_missing_file_and_bad_flags(tmp_path, capsys):
    assert main(["hash", "--tokens-json", str(tmp_path / "nope.json")]) == 1
    assert "cannot read" in capsys.readouterr().err
    tokens = tmp_path / "t.json"
    tokens.write_text("[1]")
    assert main(["hash", "--tokens-json", str(tokens), "--lora-name", "x"]) == 2
    assert main(["hash", "--tokens-json", str(tokens), "--block-size", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["hash", "--tokens-json", str(tokens), "--algo", "md5"])
    assert exc.value.code == 2


def test_console_script_reads_stdin():
    case = VECTORS[0]
    proc = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "hash", "--tokens-json", "-"],
        input=json.dumps(case["token_ids"]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout.split() == case["block_hashes"]
