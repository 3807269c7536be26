"""Request bodies are checked on bytes before any recursive code sees them: size, UTF-8, nesting
depth, lone surrogates. The depth check is compared with a plain character-by-character JSON
walker on seeded random documents full of the cases that move string boundaries."""

from __future__ import annotations

import json
import math
import random

import pytest

from kvgate.router.core.errors import RouterError
from kvgate.router.server.body import (
    STRICT_JSON_ABOVE,
    ClientDisconnected,
    nesting_problem,
    parse_json_object,
    read_body,
)


def _reference(raw: bytes, max_depth: int) -> str | None:
    """What nesting_problem must answer, the slow and obvious way."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw.decode():
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
            if depth < 0:
                return "unbalanced"
    return "deep" if deepest > max_depth else None


def _nested(depth: int) -> bytes:
    return b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize(("depth", "problem"), [(63, None), (64, None), (65, "deep")])
def test_depth_limit_is_exact(depth, problem):
    assert nesting_problem(_nested(depth), 64) == problem


def test_brackets_inside_strings_are_text():
    body = {"model": "m", "prompt": "[" * 5000 + '\\"{' * 100 + "\\\\" + "]" * 10}
    assert nesting_problem(json.dumps(body).encode(), 8) is None


def test_escaped_quotes_and_backslashes_keep_string_boundaries():
    # `"\\"` ends the string after an escaped backslash; `"\""` does not end at the escape.
    raw = b'{"a": "\\\\", "b": [[[[[]]]]], "c": "\\"[[[[[[[[[["}'
    assert nesting_problem(raw, 5) == "deep"  # the object, then five arrays
    assert nesting_problem(raw, 6) is None


def test_unbalanced_and_unclosed_brackets():
    assert nesting_problem(b"]" * 100 + b"[" * 100, 64) == "unbalanced"
    assert nesting_problem(b"[" * 100_000, 64) == "deep"  # never closed: json would recurse


def _random_document(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if depth > 12 or roll < 0.4:
        return rng.choice(['a\\"[', "\\\\", "]}{", '"', 1, None, 'x\\\\"', "[[[[", "🙂"])
    if roll < 0.65:
        return [_random_document(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    keys = rng.sample(["[", "k", '"', "\\"], rng.randint(1, 2))
    return {key: _random_document(rng, depth + 1) for key in keys}


def test_agrees_with_a_character_walker_on_random_documents():
    rng = random.Random(20240611)
    outcomes = set()
    for _ in range(2000):
        raw = json.dumps(_random_document(rng), ensure_ascii=rng.random() < 0.5).encode()
        max_depth = rng.choice([2, 3, 5, 10, 30])
        outcome = nesting_problem(raw, max_depth)
        assert outcome == _reference(raw, max_depth), raw[:200]
        outcomes.add(outcome)
    assert outcomes == {None, "deep"}  # the generator exercises both sides of the limit
    for _ in range(300):  # and on broken bytes too (slices of documents)
        raw = json.dumps(_random_document(rng)).encode()
        cut = raw[: rng.randint(0, len(raw))]
        try:
            cut.decode()
        except UnicodeDecodeError:
            continue
        # A cut can leave a string open; the walker and the check then agree on "inside".
        assert nesting_problem(cut, 3) == _reference(cut, 3), cut[:200]


def test_slices_carry_depth_and_quotes(monkeypatch):
    import kvgate.router.server.body as body

    monkeypatch.setattr(body, "_SLICE_BYTES", 7)
    raw = b'{"s": "[[[[[[", "a": [[[[[[1]]]]]]}'
    assert nesting_problem(raw, 6) == "deep"
    assert nesting_problem(raw, 7) is None


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", "invalid_request"),
        (b"\xff\xfe{}", "invalid_utf8"),
        (b'{"a": "\xc3"}', "invalid_utf8"),
        (_nested(65), "json_too_deep"),
        (b"[" * 5000, "json_too_deep"),
        (b"]]]]]" * 100, "invalid_request"),
        (b'{"a": "\\ud800"}', "invalid_unicode"),
        (b'{"a": "x\\uDFFFy"}', "invalid_unicode"),
        (b"[1, 2]", "invalid_request"),
        (b"{nope", "invalid_request"),
    ],
)
def test_bad_bodies_are_400s_with_a_code(raw, code):
    with pytest.raises(RouterError) as info:
        parse_json_object(raw, 64)
    assert info.value.status == 400
    assert info.value.code == code


def test_escaped_surrogate_pairs_are_fine():
    body = parse_json_object(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}', 64)
    assert body == {"a": "😀", "b": "\\ud800"}


def test_a_body_is_read_as_pythons_json_reads_it():
    rng = random.Random(7)
    for _ in range(500):
        raw = json.dumps({"k": _random_document(rng)}, ensure_ascii=rng.random() < 0.5).encode()
        assert parse_json_object(raw, 64) == json.loads(raw)


def test_nan_infinity_and_huge_numbers_as_vllm_reads_them_up_to_a_mib():
    body = parse_json_object(b'{"t": NaN, "u": Infinity, "v": 1e400, "w": -0.0}', 64)
    assert math.isnan(body["t"]) and body["u"] == body["v"] == math.inf
    assert math.copysign(1, body["w"]) == -1


@pytest.mark.parametrize(
    ("field", "code"),
    [
        (b'"x": NaN', "invalid_request"),
        (b'"x": "\xc3"', "invalid_utf8"),
        (b'"x": "\\ud800"', "invalid_request"),
        (b'"x": [1,]', "invalid_request"),
    ],
)
def test_a_body_over_a_mib_must_be_rfc_8259_json(field, code):
    raw = b'{"pad": "' + b"a" * STRICT_JSON_ABOVE + b'", ' + field + b"}"
    with pytest.raises(RouterError) as info:
        parse_json_object(raw, 64)
    assert info.value.status == 400
    assert info.value.code == code


async def _receiver(messages):
    it = iter(messages)

    async def receive():
        return next(it)

    return receive


async def test_read_body_limits_and_disconnects():
    parts = [{"type": "http.request", "body": b"ab", "more_body": True},
             {"type": "http.request", "body": b"cd", "more_body": False}]  # fmt: skip
    assert await read_body(await _receiver(parts), None, 1024) == b"abcd"
    with pytest.raises(RouterError) as info:
        await read_body(await _receiver(parts), "5000", 1024)
    assert info.value.status == 413
    big = [{"type": "http.request", "body": b"x" * 600, "more_body": True}] * 2
    with pytest.raises(RouterError):
        await read_body(await _receiver(big), None, 1024)
    gone = [{"type": "http.request", "body": b"x", "more_body": True}, {"type": "http.disconnect"}]
    with pytest.raises(ClientDisconnected):
        await read_body(await _receiver(gone), None, 1024)


@pytest.mark.parametrize("slice_bytes", [1, 2, 3, 7, 64])
def test_slices_carry_escapes_strings_and_depth_across_their_edges(monkeypatch, slice_bytes):
    """Bodies are checked in slices: a run of backslashes, a string or a depth that spans an
    edge reads as it does in one piece."""
    monkeypatch.setattr("kvgate.router.server.body._SLICE_BYTES", slice_bytes)
    rng = random.Random(slice_bytes)
    for _ in range(300):
        raw = json.dumps(_random_document(rng)).encode()
        max_depth = rng.choice([1, 2, 3, 5])
        assert nesting_problem(raw, max_depth) == _reference(raw, max_depth), raw[:200]
