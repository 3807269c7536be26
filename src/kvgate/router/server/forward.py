"""The body the router sends to the pod, from the client's bytes, with as little work as it can.

The router changes a body only to inject the tenant's cache salt, to ask a stream for usage, to
name the pod in a Responses API request's id, to remove `cache` ops a pod does not take (or a
`vllm_xargs.kv_cache_report_mode`, which changes the pod's KV events), or to add the ones it
chose. Writing a large body anew holds the GIL, so the event loop, for all of it
(`json.dumps`: ~38 ms for 13 MB): fields the client did not send are instead written into the
client's bytes right after the object's opening brace (one copy: 1 ms for 13 MB), so the common
cases (a salt, `stream_options`, `request_id` where the client set none) never serialise the
body. Only a change to a field the client sent, or a removal, writes the body anew, with
`msgspec` above `STRICT_JSON_ABOVE` (such bodies are RFC 8259 JSON: `body.py`; ~4 ms for 13 MB)
and with `json` below it, which keeps the `NaN`/`Infinity` literals vLLM accepts.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from kvgate.router.server.body import STRICT_JSON_ABOVE

_WHITESPACE = b" \t\r\n"
_REPORT_MODE = "kv_cache_report_mode"  # vLLM 0.33's `vllm_xargs` key for KV event reports
_CLOSES = re.compile(rb"[ \t\r\n]*\}")  # an object with no member


def forward_body(
    raw: bytes,
    body: dict[str, Any],
    salt: str | None,
    add_usage: bool,
    *,
    cache_ops: bool,
    changed: bool = False,
    response_id: str | None = None,
) -> bytes:
    """The body sent to the pod: tenant salt injected, usage requested for streams, `cache` ops
    removed for engines that do not support them (vLLM would ignore them; the router keyed the
    prompt without them), `request_id` set to `response_id` (a Responses API request without
    one). `changed`: `body` is no longer what `raw` holds."""
    added: dict[str, Any] = {}
    if response_id is not None:  # the client sent none
        added["request_id"] = response_id
    if salt is not None and body.get("cache_salt") != salt:
        if "cache_salt" in body:
            body = {**body, "cache_salt": salt}
            changed = True
        else:
            added["cache_salt"] = salt
    elif salt is None and "cache_salt" in body:
        body = {k: v for k, v in body.items() if k != "cache_salt"}
        changed = True
    if not cache_ops and "cache" in body:
        body = {k: v for k, v in body.items() if k != "cache"}
        changed = True
    xargs = body.get("vllm_xargs")
    if isinstance(xargs, dict) and _REPORT_MODE in xargs:
        # "full" makes vLLM publish a BlockStored for every cache hit: the directory counts
        # each as a copy, and one eviction then leaves the block listed for good.
        body = {**body, "vllm_xargs": {k: v for k, v in xargs.items() if k != _REPORT_MODE}}
        changed = True
    if add_usage:
        if "stream_options" in body:
            options = body["stream_options"]
            merged = dict(options) if isinstance(options, dict) else {}
            merged["include_usage"] = True
            # vLLM sends usage on every chunk only with include_usage: the client asked for
            # none, and only the last chunk's usage is stripped
            merged.pop("continuous_usage_stats", None)
            body = {**body, "stream_options": merged}
            changed = True
        else:
            added["stream_options"] = {"include_usage": True}
    if changed:
        return _encode({**body, **added}, len(raw))
    if added:
        return _prepend(raw, added)
    return raw


def _encode(body: dict[str, Any], size: int) -> bytes:
    if size > STRICT_JSON_ABOVE:
        return msgspec.json.encode(body)
    return json.dumps(body, separators=(",", ":")).encode()


def _prepend(raw: bytes, fields: dict[str, Any]) -> bytes:
    """`raw` (a JSON object none of whose keys is in `fields`) with `fields` first."""
    brace = len(raw) - len(raw.lstrip(_WHITESPACE))  # `raw` parsed as an object: `{` is here
    written = json.dumps(fields, separators=(",", ":")).encode()[1:-1]
    empty = _CLOSES.match(raw, brace + 1) is not None
    rest = memoryview(raw)[brace + 1 :]  # copied once, by the join
    return b"".join((b"{", written, b"" if empty else b",", rest))
