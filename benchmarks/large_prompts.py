"""Large prompts against one real router process and real simulated pods (issue 13).

    .venv/bin/python -m benchmarks.large_prompts latency [--prompt-mb 16] [--max-model-len N]
        [--prompt-chars N --senders 2 --router-only --inline-max-chars N]
    .venv/bin/python -m benchmarks.large_prompts memory [--prompts 1000] [--prompt-mb 4]
        [--sessions 10000] [--session-kb 4] [--max-model-len N]

Both start two `kvgate sim serve` pods and `kvgate router --config` (exact keys with the
repository's test tokenizer, routing history only) as separate processes on loopback.

latency: four closed-loop clients send small chat requests throughout; phases alternate
`--phase-seconds` without and with large prompts (one at a time, back to back, each a fresh
`--prompt-mb` MB chat message). Reported: the small requests' p50/p99 in each kind of phase,
the added p99 and the ratio, and how the large prompts were answered. `--prompt-chars` sends
prompts of that many characters instead (a fresh one each time), from `--senders` clients at
once; `--router-only` makes the small requests `GET /v1/models` (answered by the router, so
only its event loop is measured, not the pods); `--inline-max-chars` sets
`keying.inline_max_chars` (the router's default otherwise). `--max-model-len`
(default 1,048,576) is the pool's `engine.max_model_len`: a 16 MB prompt of this text (~5.5 M
tokens) passes the cheap character bound and is tokenized whole, off the loop, before the
count refuses it; `0` leaves the limit unset (the prompt is tokenized, hashed and forwarded).

memory: `--prompts` fresh prompts (half chat, half completions, each with a new session id)
then `--sessions` small requests with distinct `--session-kb` KB session ids, sent by four
clients; the router's RSS is reported before, every 100 prompts and at the end. Without a
limit (`--max-model-len 0`, the default here) every prompt is keyed and kept as far as the
byte budgets let it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from tests.integration.conftest import free_port
from tests.integration.router.router_process import (
    RouterProcess,
    Samples,
    large_chat_body,
    router_config,
    small_load,
    text_of,
)
from tests.integration.sim.processes import SimProcess

MB = 1 << 20
SIM_FLAGS = ["--model", "m", "--enable-prompt-tokens-details", "--sim-time-scale", "0.01"]


def start_pods(workdir: Path, n: int = 2) -> list[SimProcess]:
    pods = []
    for i in range(n):
        port = free_port()
        args = ["serve", "--port", str(port), "--host", "127.0.0.1", *SIM_FLAGS]
        pods.append(SimProcess(args, [port], workdir / f"pod-{i}.log"))
    for pod in pods:
        pod.wait_ready()
    return pods


async def latency(args: argparse.Namespace, workdir: Path, pod_urls: list[str]) -> dict[str, Any]:
    engine = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    config = {**router_config(pod_urls, **engine), "limits": {"max_body_bytes": 64 * MB}}
    if args.inline_max_chars is not None:
        config["keying"] = {"inline_max_chars": args.inline_max_chars}
    router = RouterProcess(config, workdir)
    try:
        # Built before the load starts: building them blocks this process's event loop.
        if args.prompt_chars:
            # More than a phase can send, at most 256 MB of them (a sender that runs out stops).
            count = min(args.rounds * args.senders * 1000, max(1, 256 * MB // args.prompt_chars))
            bodies = [large_chat_body(args.prompt_chars, seed) for seed in range(count)]
        else:
            bodies = [large_chat_body(args.prompt_mb * MB, seed) for seed in range(args.rounds)]
        await router.wait_ready()
        samples = Samples()
        phase = ["warmup"]
        stop = asyncio.Event()
        load = asyncio.create_task(
            small_load(router.url, samples, phase, stop, router_only=args.router_only)
        )
        large: list[dict[str, Any]] = []
        seconds = {"without": 0.0, "with": 0.0}
        fresh = iter(bodies)

        async def send_large(client: httpx.AsyncClient, round_: int, until: float) -> None:
            first = True
            while first or time.perf_counter() < until:
                first = False
                body = next(fresh, None) if args.prompt_chars else bodies[round_]
                if body is None:
                    return
                started = time.perf_counter()
                response = await client.post(
                    "/v1/chat/completions",
                    content=body,
                    headers={"content-type": "application/json"},
                )
                large.append(
                    {
                        "status": response.status_code,
                        "seconds": round(time.perf_counter() - started, 3),
                        "code": response.json().get("error", {}).get("code")
                        if response.status_code != 200
                        else None,
                    }
                )

        await asyncio.sleep(1.0)
        async with httpx.AsyncClient(base_url=router.url, timeout=120) as client:
            for round_ in range(args.rounds):
                phase[0] = "without"
                await asyncio.sleep(args.phase_seconds)
                seconds["without"] += args.phase_seconds
                phase[0] = "with"
                began = time.perf_counter()
                until = began + args.phase_seconds
                await asyncio.gather(
                    *(send_large(client, round_, until) for _ in range(args.senders))
                )
                seconds["with"] += time.perf_counter() - began
            phase[0] = "without"
            await asyncio.sleep(args.phase_seconds)
            seconds["without"] += args.phase_seconds
        stop.set()
        await load
        p99_with, p99_without = samples.quantile("with", 0.99), samples.quantile("without", 0.99)
        return {
            "prompt_mb": None if args.prompt_chars else args.prompt_mb,
            "prompt_chars": args.prompt_chars or None,
            "senders": args.senders,
            "inline_max_chars": args.inline_max_chars,
            "small_requests_are": "GET /v1/models" if args.router_only else "chat",
            "max_model_len": args.max_model_len or None,
            "small_requests": {k: len(v) for k, v in samples.by_phase.items()},
            "small_errors": samples.errors[:10],
            "p50_ms": {
                "without": round(samples.quantile("without", 0.5) * 1000, 1),
                "with": round(samples.quantile("with", 0.5) * 1000, 1),
            },
            "p99_ms": {"without": round(p99_without * 1000, 1), "with": round(p99_with * 1000, 1)},
            # A closed loop sends less while it waits: a stall shows in the max and the rate.
            "max_ms": {k: round(samples.quantile(k, 1.0) * 1000, 1) for k in seconds},
            "per_second": {
                k: round(len(samples.by_phase.get(k, [])) / v) for k, v in seconds.items() if v
            },
            "added_p99_ms": round((p99_with - p99_without) * 1000, 1),
            "p99_ratio": round(p99_with / p99_without, 2),
            "large_prompts": _summary(large),
            "router_rss_mb": round(router.rss_bytes() / MB, 1),
        }
    finally:
        router.stop()


async def memory(args: argparse.Namespace, workdir: Path, pod_urls: list[str]) -> dict[str, Any]:
    engine = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    config = router_config(pod_urls, **engine)
    if args.no_token_cap:
        config["keying"] = {"max_prompt_tokens": None}
    router = RouterProcess(config, workdir)
    rss: list[tuple[str, float]] = []
    statuses: dict[str, int] = {}
    try:
        await router.wait_ready()
        rss.append(("start", router.rss_bytes() / MB))
        queue: asyncio.Queue[tuple[str, bytes, dict[str, str]] | None] = asyncio.Queue(8)

        async def producer() -> None:
            rng = random.Random(1)
            base = text_of(args.prompt_mb * MB, rng)
            for i in range(args.prompts):
                session = {"x-session-id": f"big-{i}-" + "s" * (args.session_kb * 1024)}
                # Distinct prompts, cheaply: the base text rotated, behind a unique header.
                at = rng.randrange(len(base))
                text = f"[{i}] " + base[at:] + base[:at]
                if i % 2:
                    body = {"model": "m", "prompt": text, "max_tokens": 1}
                    await queue.put(("/v1/completions", json.dumps(body).encode(), session))
                else:
                    messages = [{"role": "user", "content": text}]
                    body = {"model": "m", "messages": messages, "max_tokens": 1}
                    await queue.put(("/v1/chat/completions", json.dumps(body).encode(), session))
                if (i + 1) % 100 == 0:
                    rss.append((f"after {i + 1} prompts", router.rss_bytes() / MB))
            for i in range(args.sessions):
                session = {"x-session-id": f"{i}-" + "k" * (args.session_kb * 1024)}
                body = {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]}
                await queue.put(("/v1/chat/completions", json.dumps(body).encode(), session))
            for _ in range(4):
                await queue.put(None)

        async def sender() -> None:
            async with httpx.AsyncClient(base_url=router.url, timeout=300) as client:
                while (item := await queue.get()) is not None:
                    path, content, headers = item
                    headers = {**headers, "content-type": "application/json"}
                    response = await client.post(path, content=content, headers=headers)
                    key = str(response.status_code)
                    statuses[key] = statuses.get(key, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(producer(), *(sender() for _ in range(4)))
        rss.append(("end", router.rss_bytes() / MB))
        await asyncio.sleep(5)
        rss.append(("5 s later", router.rss_bytes() / MB))
        return {
            "prompts": args.prompts,
            "prompt_mb": args.prompt_mb,
            "sessions": args.sessions,
            "session_kb": args.session_kb,
            "max_model_len": args.max_model_len or None,
            "max_prompt_tokens": None if args.no_token_cap else "default",
            "statuses": statuses,
            "seconds": round(time.perf_counter() - started, 1),
            "rss_mb": [(label, round(value, 1)) for label, value in rss],
        }
    finally:
        router.stop()


def _summary(large: list[dict[str, Any]]) -> dict[str, Any]:
    answers: dict[str, int] = {}
    for item in large:
        key = f"{item['status']} {item['code'] or ''}".strip()
        answers[key] = answers.get(key, 0) + 1
    seconds = sorted(item["seconds"] for item in large)
    return {
        "count": len(large),
        "answers": answers,
        "seconds_min_max": [seconds[0], seconds[-1]] if seconds else None,
        "seconds_mean": round(sum(seconds) / len(seconds), 4) if seconds else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--prompt-mb", type=int, default=16)
    lat.add_argument("--max-model-len", type=int, default=1 << 20)
    lat.add_argument("--phase-seconds", type=float, default=8.0)
    lat.add_argument("--rounds", type=int, default=2)
    lat.add_argument("--prompt-chars", type=int, default=0, help="instead of --prompt-mb")
    lat.add_argument("--senders", type=int, default=1)
    lat.add_argument("--router-only", action="store_true", help="small requests: /v1/models")
    lat.add_argument("--inline-max-chars", type=int, default=None)
    mem = sub.add_parser("memory")
    mem.add_argument("--prompts", type=int, default=1000)
    mem.add_argument("--prompt-mb", type=int, default=4)
    mem.add_argument("--sessions", type=int, default=10_000)
    mem.add_argument("--session-kb", type=int, default=4)
    mem.add_argument("--max-model-len", type=int, default=0)
    mem.add_argument(
        "--no-token-cap", action="store_true", help="keying.max_prompt_tokens: null (key all)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        pods = start_pods(workdir)
        try:
            urls = [pod.url for pod in pods]
            run = latency if args.command == "latency" else memory
            result = asyncio.run(run(args, workdir, urls))
        finally:
            for pod in pods:
                pod.stop()
    print(json.dumps(result, indent=1))  # noqa: T201 - the benchmark's report


if __name__ == "__main__":
    main()
