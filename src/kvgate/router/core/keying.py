"""Key a request's prompt without stalling the event loop for everyone else.

A small prompt (up to `keying.inline_max_chars`, 8 Ki characters: at most ~3 ms of template,
tokenization and hashing, less for text seen before) is keyed inline: a thread hop would cost
about as much as the work. A larger one (more characters, or a body at least that many bytes)
goes to a bounded pool of worker threads:

- the tokenizer runs without the GIL (`Tokenizer` uses `encode_batch_fast`), so the loop keeps
  its core while a multi-megabyte prompt is tokenized;
- the Python parts (splitting, hashing: pickle + SHA-256 per block) hold the GIL, but the
  interpreter hands it back to the loop every switch interval (5 ms), and their length is
  bounded by the pool's `max_model_len` (the keyer refuses longer prompts before hashing);
- there is no lock around a keyer: its caches are safe for concurrent use, so a small request
  keyed on the loop never waits for a large one in a worker;
- no prompt costs more than `max_prompt_tokens` (default 2^20) of tokenization, also where a
  pool's `max_model_len` is unknown or larger: the tokenizer's transient memory (~300 bytes a
  token) and the hashing time stay bounded;
- the loop's own work stays small: with 64 Ki characters keyed inline (the default before),
  fresh 48,000-character chat prompts sent back to back by two clients held the loop ~20 ms
  each, and requests the router answers itself waited 70 ms at p99 (4.6 ms without them); with
  8 Ki, 22 ms, and the prompts were answered 6% sooner (20,000 characters: 35 -> 15 ms, the
  prompts 8% later: a thread hop and the GIL shared with the loop; docs/router.md, "Limits");
- at most `workers` prompts are keyed at once; while they are all busy, a prompt that would wait
  behind more than `max_waiting_chars` characters of prompts in hand is refused with 503
  (`keying_overloaded`), so a flood of huge prompts costs bounded memory and time instead of a
  queue that grows without limit, while a burst of many mid-sized prompts just waits its turn
  (counted in characters, not prompts: a prompt's keying time grows with its length).

Size without parsing: the body's size in bytes when the HTTP layer gives it (a JSON string is
never shorter in bytes than in characters), else (`/debug/route`, `/admin/warm`) a walk of the
body that stops at the threshold (`prompt_chars_at_least`; such a prompt counts as that many
characters towards `max_waiting_chars`, and is followed by a trim).

Memory: after a large prompt the worker hands the C allocator's free memory back to the OS
(`malloc_trim`, glibc): tokenizing leaves hundreds of megabytes freed but mapped in the
thread's malloc arena (400 MB after a 4 MB prompt), which would otherwise stay in the RSS; at
once after a prompt of `TRIM_NOW_CHARS` (1 Mi) characters or more (a trim costs ~1 ms, more than
keying a mid-sized prompt saves by leaving the loop). The request's own buffers (body, parsed
JSON, ids) are freed only once it is answered, so one more trim runs in a worker
`TRIM_DELAY_SECONDS` after an offloaded prompt was keyed (at most one pending: under steady
load, one every `TRIM_DELAY_SECONDS`).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kvgate.api.router_config import KeyingConfig
from kvgate.prefix import LoraKey
from kvgate.router.core.errors import RouterError
from kvgate.router.core.keys import Keyer, RequestKeys

_NODE_CHARS = 8  # what a non-string JSON value counts for in the size walk
_SCALARS = frozenset({int, float, bool, type(None)})
TRIM_DELAY_SECONDS = 2.0
TRIM_NOW_CHARS = 1 << 20


APPROXIMATE_KEYING_FACTOR = 8
"""A pool without a tokenizer keys approximately: `inline_max_chars` times this many characters
stay on the event loop (64 KiB: 0.4 ms of chat text, 1.6 ms of 8,000 one-word messages). A
thread hop cost more than keying a 10-32 KiB body there (0.24 ms against 0.12 ms a request)."""

OPS_KEYING_FACTOR = 16
"""A body with cache ops counts as this many times its size towards `inline_max_chars`: its
messages' ends are rendered too (a 7 KiB body naming 200 of them held the loop 80 ms)."""


def prompt_chars_at_least(body: Mapping[str, Any], threshold: int) -> bool:
    """Whether the strings in `body` (its prompt, messages, tools, ...) add up to at least
    `threshold` characters. Iterative (deeply nested bodies are fine) and bounded: it visits at
    most `threshold // 8` values, each counting for at least 8 characters."""
    total = 0
    stack: list[Any] = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            total += max(len(value), _NODE_CHARS)
        elif isinstance(value, Mapping | list):
            total += _NODE_CHARS
            if total + len(value) * _NODE_CHARS >= threshold:
                return True
            if isinstance(value, list) and set(map(type, value)) <= _SCALARS:
                total += len(value) * _NODE_CHARS  # token ids: counted in C, not one by one
            else:
                stack.extend(value.values() if isinstance(value, Mapping) else value)
        else:
            total += _NODE_CHARS
        if total >= threshold:
            return True
    return False


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None
    return trim


def release_freed_memory() -> None:
    """Return the memory the C allocator holds free to the OS, where it can (glibc)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _keys_in_worker(
    keyer: Keyer,
    body: Mapping[str, Any],
    kind: str,
    cache_salt: str | None,
    lora: LoraKey | None,
    session: str | None,
    max_prompt_tokens: int | None,
    trim: bool,
) -> RequestKeys:
    try:
        return keyer.keys(
            body, kind, cache_salt, lora, session, max_prompt_tokens=max_prompt_tokens
        )
    finally:
        if trim:
            release_freed_memory()


class KeyingPool:
    """Runs `Keyer.keys` inline or in worker threads (see the module doc). Owned by the router;
    `close()` stops the workers."""

    def __init__(self, config: KeyingConfig | None = None) -> None:
        self.config = config or KeyingConfig()
        self._executor: ThreadPoolExecutor | None = None
        self._workers = 0
        self._busy = 0  # large prompts being keyed or waiting for a worker
        self._busy_chars = 0  # their sizes (characters, or bytes of their bodies)
        self._trim: asyncio.TimerHandle | None = None
        self.offloaded = 0
        self.refused = 0

    @property
    def busy(self) -> int:
        return self._busy

    def configure(self, config: KeyingConfig) -> None:
        """New settings (config reload); a new worker count takes effect for the next prompt
        (prompts already running finish on the old threads)."""
        self.config = config

    def is_large(self, body: Mapping[str, Any], body_bytes: int, *, approximate: bool) -> bool:
        threshold = self.config.inline_max_chars
        if approximate:  # no tokenizer: keyed several times faster than tokenized
            threshold *= APPROXIMATE_KEYING_FACTOR
        if body.get("cache") is not None:  # ops: its messages' ends are rendered besides
            threshold //= OPS_KEYING_FACTOR
        if body_bytes:
            return body_bytes >= threshold
        return prompt_chars_at_least(body, threshold)

    async def keys(
        self,
        keyer: Keyer,
        body: Mapping[str, Any],
        kind: str,
        cache_salt: str | None,
        lora: LoraKey | None,
        session: str | None,
        *,
        body_bytes: int = 0,
    ) -> RequestKeys:
        """`keyer.keys(...)`, inline or in a worker. Raises RouterError (400 from the keyer;
        503 when too many large prompts are already in hand)."""
        config = self.config
        cap = config.max_prompt_tokens
        if not self.is_large(body, body_bytes, approximate=keyer.requests is None):
            return keyer.keys(body, kind, cache_salt, lora, session, max_prompt_tokens=cap)
        size = max(body_bytes, config.inline_max_chars)
        if self._busy >= config.workers and self._busy_chars + size > config.max_waiting_chars:
            self.refused += 1
            raise RouterError(
                503,
                "too many large prompts are being tokenized; retry later",
                type="service_unavailable",
                code="keying_overloaded",
            )
        executor = self._pool()
        self._busy += 1
        self._busy_chars += size
        self.offloaded += 1
        trim = not body_bytes or size >= TRIM_NOW_CHARS  # a walked body's size is unknown
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                executor, _keys_in_worker, keyer, body, kind, cache_salt, lora, session, cap, trim
            )
        finally:
            self._busy -= 1
            self._busy_chars -= size
            self._schedule_trim()

    def close(self) -> None:
        """Stop the workers: queued prompts are dropped, a running one finishes on its own."""
        if self._trim is not None:
            self._trim.cancel()
            self._trim = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _schedule_trim(self) -> None:
        """One trim, in a worker, `TRIM_DELAY_SECONDS` after an offloaded prompt; one already
        pending is kept (restarting it, steady load would never let it run)."""
        if self._trim is None:
            loop = asyncio.get_running_loop()
            self._trim = loop.call_later(TRIM_DELAY_SECONDS, self._trim_now)

    def _trim_now(self) -> None:
        self._trim = None
        if self._executor is not None:
            self._executor.submit(release_freed_memory)

    def _pool(self) -> ThreadPoolExecutor:
        workers = self.config.workers
        if self._executor is None or self._workers != workers:
            if self._executor is not None:
                self._executor.shutdown(wait=False)  # its running prompts still finish
            self._executor = ThreadPoolExecutor(workers, thread_name_prefix="kvgate-keying")
            self._workers = workers
        return self._executor
