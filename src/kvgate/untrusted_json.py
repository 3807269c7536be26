"""JSON that another process wrote (a pod's answer, a field in the shared Redis), read as input
that may be hostile: anything the parser cannot turn into a value is a `ValueError`.

`json` raises `ValueError` for malformed text, but `RecursionError` for arrays or objects nested
deeper than its C recursion allows (near 1,000 levels, a few KB of `[`). Callers read malformed
input as absent by catching `ValueError`, so such nesting got past them: a pod's answer became a
500 or a cut stream, one field in Redis failed every load-sharing round. A client's request body
is bounded before it is parsed instead (`router/server/body.py`, `limits.max_json_depth`): chat
templates and digests walk it recursively afterwards. Nothing walks these values, so the
parser's own limit is the only bound they need.
"""

from __future__ import annotations

import json
from typing import Any

_DECODER = json.JSONDecoder()


def loads(raw: str | bytes) -> Any:
    """`json.loads(raw)`, with nesting too deep to parse raised as `ValueError`."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


def raw_decode(text: str) -> tuple[Any, int]:
    """The JSON value at the start of `text` and where it ends (`JSONDecoder.raw_decode`), with
    nesting too deep to parse raised as `ValueError`."""
    try:
        return _DECODER.raw_decode(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None
