"""A seeded fuzzer against a real `kvgate router` process and a real simulated pod: 10,000
hostile requests over raw keep-alive connections, and not one 5xx, ERROR line or traceback.

The cases mix what the issue found and what HTTP allows to go wrong: bodies nested thousands
deep, wrong types in every field, invalid UTF-8 (in bodies, header values and URLs), lone
surrogate escapes, huge headers and header counts, odd content-lengths (negative, non-numeric,
duplicated, too large, too small), truncated bodies (the client half-closes), chunked bodies
(valid, with garbage sizes, unterminated), garbage request lines and HTTP/2 prefaces, and the
router's own headers (class, session, API keys) with random values. Case i is generated from
its own seeded generator (`case_number(i)`), so a failure names the case that reproduces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
from tests.integration.router.edge_helpers import (
    RawConnection,
    RawResponse,
    RouterProcess,
    router_config,
)

SEED = 20260611
CASES = 10_000
WORKERS = 12
TOKENIZER = str(Path(__file__).parents[2] / "data" / "prefix" / "tokenizer")
PATHS = ["/v1/chat/completions", "/v1/completions", "/debug/route", "/admin/warm",
         "/v1/models", "/health", "/ready", "/metrics", "/nope", "/v1/chat/completions?x=1"]  # fmt: skip
FIELDS = ["model", "messages", "prompt", "stream", "stream_options", "max_tokens", "tools",
          "cache_salt", "user", "tenant", "targets", "add_special_tokens", "chat_template",
          "chat_template_kwargs", "documents", "n", "temperature", "logprobs", "echo"]  # fmt: skip
SCALARS = [None, True, False, 0, -1, 1, 2**63, 1e308, -0.0, "", "m", "x" * 300, "🙂" * 5,
           "\ud800", "\x00", "online", "batch", "all", "chosen"]  # fmt: skip

# Header value bytes: visible ASCII and bytes >= 0x80 (latin-1 / broken UTF-8), no controls.
_PRINTABLE_OR_HIGH = bytes(b if b > 32 and b != 127 else 33 + b % 90 for b in range(256))


@dataclass
class Case:
    data: bytes  # everything the client sends
    half_close: bool = False  # shut the write side after sending (truncated requests)
    note: str = ""


def _value(rng: random.Random, depth: int = 0) -> object:
    if depth > 3 or rng.random() < 0.45:
        return rng.choice(SCALARS)
    if rng.random() < 0.5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["role", "content", "type", "text", "name", "tool_calls", "image_url", "x"]
    return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _nested(rng: random.Random, depth: int) -> str:
    unit = "".join(rng.choice("[{") for _ in range(16))  # a random mix, repeated: cheap to build
    opens = (unit * (depth // 16 + 1))[:depth]
    closes = "".join("]" if o == "[" else "}" for o in reversed(opens))
    # Objects need a key before their value: `{"k":` in front of every inner element.
    return "".join(o if o == "[" else '{"k":' for o in opens) + "1" + closes


def _valid_body(rng: random.Random) -> dict:
    content = "hello " * rng.randint(1, 60)
    if rng.random() < 0.5:
        body: dict = {"model": "m", "messages": [{"role": "user", "content": content}]}
    else:
        body = {"model": "m", "prompt": content if rng.random() < 0.7 else list(range(40))}
    body["max_tokens"] = 1
    if rng.random() < 0.25:
        body["stream"] = True
    return body


def _body(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.35:  # valid, then wrong types in a few fields
        body = _valid_body(rng)
        for field in rng.sample(FIELDS, rng.randint(0, 3)):
            body[field] = _value(rng)
        return json.dumps(body).encode()
    if roll < 0.5:  # deeply nested somewhere
        depth = rng.choice([30, 64, 65, 200, 980, 1000, 5000, 20_000])
        where = rng.choice(["prompt", "messages", "tools", "content", "top"])
        nested = _nested(rng, depth)
        if where == "top":
            return nested.encode()
        if where == "content":
            text = f'{{"model":"m","messages":[{{"role":"user","content":{nested}}}]}}'
            return text.encode()
        return f'{{"model":"m","{where}":{nested},"max_tokens":1}}'.encode()
    if roll < 0.6:  # invalid UTF-8 or lone surrogates
        raw = json.dumps(_valid_body(rng)).encode()
        at = rng.randint(0, len(raw))
        bad = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\\ud800", b"\\udfff\\ud800"])
        return raw[:at] + bad + raw[at:]
    if roll < 0.75:  # random JSON documents
        return json.dumps(_value(rng)).encode()
    if roll < 0.85:  # truncated or garbled JSON
        raw = json.dumps(_valid_body(rng)).encode()
        return raw[: rng.randint(0, len(raw))]
    return rng.randbytes(rng.randint(0, 200))


def _headers(rng: random.Random) -> list[tuple[str, bytes]]:
    headers: list[tuple[str, bytes]] = [("host", b"router"), ("content-type", b"application/json")]
    if rng.random() < 0.3:
        headers.append(("authorization", rng.choice(
            [b"Bearer k-acme", b"Bearer admin-token", b"Bearer ", b"Bearer", b"Basic x",
             b"Bearer " + b"k" * 5000, b"bearer admin-token", b"\xff\xfe"])))  # fmt: skip
    if rng.random() < 0.3:
        headers.append(("x-kvgate-class", rng.choice([b"online", b"batch", b"", b"ONLINE",
                                                      b"\xc3\xa9", b"x" * 100])))  # fmt: skip
    if rng.random() < 0.3:
        size = rng.choice([1, 40, 4000, 40_000])
        headers.append(("x-session-id", rng.randbytes(size).translate(_PRINTABLE_OR_HIGH)))
    if rng.random() < 0.2:  # echoed in the response and sent to the pod
        headers.append(
            ("x-request-id", rng.randbytes(rng.randint(0, 300)).translate(_PRINTABLE_OR_HIGH))
        )
    if rng.random() < 0.1:
        headers.append(("api-key", rng.choice([b"k-beta", b"", b"\x80" * 10])))
    if rng.random() < 0.05:  # one huge header, or a great many small ones: 431
        if rng.random() < 0.5:
            headers.append(("x-big", b"a" * rng.randint(70_000, 150_000)))
        else:
            headers += [(f"x-h{i}", b"v" * 40) for i in range(rng.randint(1700, 4000))]
    if rng.random() < 0.05:
        headers.append(("expect", b"100-continue"))
    return headers


def _case(rng: random.Random) -> Case:
    roll = rng.random()
    if roll < 0.03:  # not HTTP/1.1 at all
        junk = rng.choice([b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x02\x00",
                           b"GET / HTTP/9.9\r\n\r\n", b"get /health http/1.1\r\n\r\n",
                           b"GET /" + b"a" * 80_000 + b" HTTP/1.1\r\n\r\n",
                           b"POST /v1/completions HTTP/1.1\r\nbad header\r\n\r\n",
                           b"GET /%ff%fe HTTP/1.1\r\nhost: r\r\n\r\n",
                           b"GET /health HTTP/1.0\r\n\r\n"])  # fmt: skip
        return Case(junk, half_close=True, note="junk")
    method = rng.choice(["POST"] * 8 + ["GET", "PUT", "DELETE", "OPTIONS", "HEAD"])
    path = rng.choice(PATHS)
    body = _body(rng)
    headers = _headers(rng)
    framing = rng.random()
    half_close = False
    if framing < 0.7:
        headers.append(("content-length", str(len(body)).encode()))
        payload = body
    elif framing < 0.82:  # chunked, sometimes broken
        headers.append(("transfer-encoding", b"chunked"))
        parts, at = [], 0
        while at < len(body):
            size = rng.randint(1, 4096)
            parts.append(b"%x\r\n" % len(body[at : at + size]) + body[at : at + size] + b"\r\n")
            at += size
        payload = b"".join(parts) + b"0\r\n\r\n"
        if rng.random() < 0.2:
            payload = rng.choice([b"zz\r\n" + payload, payload[:-5], b"ffffffffffff\r\n"])
            half_close = True
    else:  # odd content-lengths
        value = rng.choice([b"-1", b"abc", b"99999999999999999999", b"1.5", b" 7", b"",
                            str(len(body) + 50).encode(), str(max(0, len(body) - 5)).encode(),
                            str(64 * 1024 * 1024).encode()])  # fmt: skip
        headers.append(("content-length", value))
        if rng.random() < 0.3:
            headers.append(("content-length", str(len(body)).encode()))
        payload = body
        half_close = True  # the framing may leave the server waiting for bytes never sent
    head = f"{method} {path} HTTP/1.1\r\n".encode()
    head += b"".join(name.encode() + b": " + value + b"\r\n" for name, value in headers)
    return Case(head + b"\r\n" + payload, half_close=half_close, note=f"{method} {path}")


def case_number(i: int) -> Case:
    """Case `i` of the run, the same whatever order the workers take cases in."""
    return _case(random.Random(SEED * 1_000_003 + i))


async def _run(
    case: Case, port: int, conn: RawConnection | None
) -> tuple[RawResponse, RawConnection | None]:
    """Send one case; the response (status None: closed unanswered) and a reusable connection."""
    if conn is None or case.half_close:
        if conn is not None:
            conn.close()
        conn = await RawConnection.open(port)
    if not await conn.send(case.data):
        conn.close()
        return RawResponse(None), None
    if case.half_close:
        with contextlib.suppress(OSError):  # the router already closed: answered, or refused
            conn.writer.write_eof()
    try:
        response = await conn.response(within_seconds=10, head=case.data.startswith(b"HEAD"))
    except (TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError, ConnectionError):
        conn.close()
        return RawResponse(None), None
    keep = (
        response.status is not None
        and not case.half_close
        and response.headers.get("connection") != "close"
    )
    if not keep:
        conn.close()
        return response, None
    return response, conn


def _error_code(response: RawResponse) -> str | None:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


async def test_ten_thousand_hostile_requests_give_no_5xx(sim_pods, tmp_path: Path):
    online, batch = sim_pods(2)
    # A pool per class: batch requests (a tenant's class, or the header) have a home, and a
    # 503 can only mean a router fault, never "no batch capacity right now".
    engine = {"tokenizer": {"path": TOKENIZER}}
    config = router_config(
        [online.url],
        pools=[{"name": "p", "model": "m", "engine": engine,
                "endpoints": {"static": [{"url": online.url}]}},
               {"name": "b", "model": "m", "engine": engine, "pool_class": "batch",
                "endpoints": {"static": [{"url": batch.url}]}}],
        tenants={"tenants": [{"name": "acme", "api_keys": [{"value": "k-acme"}]},
                             {"name": "beta", "api_keys": [{"value": "k-beta"}],
                              "request_class": "batch"}]},
        admin={"token": {"value": "admin-token"}},
        server={"header_timeout_seconds": 2.0, "body_timeout_seconds": 1.0},
    )  # fmt: skip
    proc = RouterProcess(tmp_path, config)
    proc.wait_ready()
    statuses: Counter[int | None] = Counter()
    codes: Counter[str | None] = Counter()
    failures: list[tuple[int, int | None, Case]] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(CASES):
        queue.put_nowait(i)

    async def worker() -> None:
        conn: RawConnection | None = None
        while not queue.empty():
            i = queue.get_nowait()
            case = case_number(i)
            response, conn = await _run(case, proc.port, conn)
            status = response.status
            statuses[status] += 1
            if status is not None and 400 <= status < 500:
                codes[_error_code(response)] += 1
            if status is not None and status >= 500:
                failures.append((i, status, case))
        if conn is not None:
            conn.close()

    started = time.monotonic()
    try:
        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(WORKERS))), 110)
        elapsed = time.monotonic() - started
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
            assert (await client.get("/health")).status_code == 200
            resp = await client.post(
                "/v1/completions", json={"model": "m", "prompt": "still here", "max_tokens": 1}
            )
            assert resp.status_code == 200, resp.text
    finally:
        proc.stop()
    shown = [(i, s, c.note, c.data[:300]) for i, s, c in failures[:3]]
    assert not failures, f"{len(failures)} 5xx; case_number(i) rebuilds case i: {shown}"
    assert sum(statuses.values()) == CASES
    # The mix reaches every layer: answers from the pod, 4xx of each kind, edge refusals.
    for status in (200, 400, 401, 404, 405, 413, 431):
        assert statuses[status] > 0, statuses
    for code in (
        "json_too_deep",
        "invalid_utf8",
        "invalid_unicode",
        "header_too_large",
        "invalid_request",
        "body_too_large",
        "bad_class",
        "invalid_admin_token",
    ):
        assert codes[code] > 0, codes  # fmt: skip
    assert proc.error_lines() == [], proc.error_lines()[:10]
    print(f"\n{CASES} cases in {elapsed:.1f} s: {dict(statuses)}\n{dict(codes)}")
