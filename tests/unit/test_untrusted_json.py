"""Other processes' JSON: nesting too deep for Python's parser is malformed input like any other
(a `ValueError`), never a `RecursionError` that escapes callers reading bad input as absent."""

from __future__ import annotations

import pytest

from kvgate import untrusted_json

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("raw", [DEEP, DEEP.encode(), '{"a":' * 100_000, "[" * 100_000])
def test_nesting_too_deep_to_parse_is_a_value_error(raw: str | bytes) -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        untrusted_json.loads(raw)
    with pytest.raises(ValueError, match="nested too deeply"):
        untrusted_json.raw_decode(raw if isinstance(raw, str) else raw.decode())


def test_json_within_the_parsers_reach_reads_as_json() -> None:
    assert untrusted_json.loads(b'{"usage": [[1]]}') == {"usage": [[1]]}
    assert untrusted_json.raw_decode('{"a": 1}} trailing') == ({"a": 1}, 8)
    with pytest.raises(ValueError):
        untrusted_json.loads(b"\xff")
