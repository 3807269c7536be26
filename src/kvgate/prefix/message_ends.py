"""Where each message of a chat prompt ends, in tokens, remembered across a session's turns.

Message *i* ends after the ids of the first i+1 messages rendered without a generation prompt,
when those ids are a prefix of the whole prompt's ids (else cache ops cannot name it). Rendering
and tokenizing the messages before each boundary costs O(history) per boundary, and an agent's
rolling drop names hundreds of boundaries, almost all of them already named by its previous
turn. So each end is remembered (an LRU of `max_entries`), keyed by a digest of what renders it
(the body's template fields and messages[:i+1]), together with a digest of the head's ids; a
later prompt reuses it after checking, in one pass over its own ids, that its first n ids have
that digest. Only new boundaries are rendered.

A request renders new boundaries, lowest first, up to a budget of messages rendered
(`render_budget`: four times its own messages, at least `MIN_RENDER_BUDGET`); the ends past it
are left out of the answer and rendered by later turns, which find the earlier ones
remembered. One request naming every boundary of 2,000 messages rendered 2 million messages,
9.8 s, and 1,600 tool responses under the router's rolling drop 57 s.
"""

from __future__ import annotations

import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvgate.prefix.completion_prompt import PromptError

# Body fields besides `messages` that change how a chat prompt renders and tokenizes.
RENDER_FIELDS = (
    "tools",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "reasoning_effort",
    "add_special_tokens",
)
DEFAULT_MAX_ENTRIES = 1 << 16  # ~100 bytes each
MIN_RENDER_BUDGET = 1 << 12  # messages rendered (~5 us each with a tokenizer's template)


def render_budget(messages: int) -> int:
    """Messages one request may render for new ends: four renders of its own prompt."""
    return max(4 * messages, MIN_RENDER_BUDGET)


def _ids_digest(ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()


class MessageEnds:
    """Remembered message ends (see the module doc); safe for concurrent use."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self.rendered = 0  # boundaries rendered (not remembered)

    def ends(
        self,
        body: Mapping[str, Any],
        ids: Sequence[int],
        indices: Iterable[int],
        head_ids: Callable[[Mapping[str, Any]], list[int]],
        budget: int | None = None,
    ) -> dict[int, int]:
        """Message index → token offset in `ids`; `head_ids(body)` tokenizes a head body.
        New ends are rendered while `budget` messages rendered allow (None: all); those past
        it are missing from the answer. Raises PromptError where a head is not a prefix of
        `ids`."""
        messages = body["messages"]
        wanted = sorted(set(indices))
        if not wanted:
            return {}
        context = json.dumps([body.get(f) for f in RENDER_FIELDS], sort_keys=True, default=str)
        chain = hashlib.blake2b(context.encode(), digest_size=16)
        keys: dict[int, bytes] = {}
        want = set(wanted)
        for i, message in enumerate(messages[: wanted[-1] + 1]):
            chain.update(json.dumps(message, sort_keys=True, default=str).encode())
            chain.update(b"\0")
            if i in want:
                keys[i] = chain.copy().digest()
        found: dict[int, tuple[int, bytes]] = {}
        with self._lock:
            for i in wanted:
                entry = self._entries.get(keys[i])
                if entry is not None:
                    self._entries.move_to_end(keys[i])
                    found[i] = entry
        for i in wanted:
            if i in found:
                continue
            if budget is not None:
                budget -= i + 1
                if budget < 0:
                    break  # ascending: every later head costs more
            head = {
                **body,
                "messages": messages[: i + 1],
                "add_generation_prompt": False,
                "continue_final_message": False,
            }
            ids_i = head_ids(head)
            found[i] = (len(ids_i), _ids_digest(ids_i))
            self.rendered += 1
            with self._lock:
                self._entries[keys[i]] = found[i]
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        _check_prefixes(ids, found)
        return {i: n for i, (n, _digest) in found.items()}


def _check_prefixes(ids: Sequence[int], found: Mapping[int, tuple[int, bytes]]) -> None:
    """Every head's ids are the first ids of the prompt: one pass over `ids`."""
    running = hashlib.blake2b(digest_size=16)
    done = 0
    for i, (n, digest) in sorted(found.items(), key=lambda item: item[1][0]):
        if n > len(ids):
            raise _not_a_prefix(i)
        if n > done:
            running.update(array("q", ids[done:n]).tobytes())
            done = n
        if running.copy().digest() != digest:
            raise _not_a_prefix(i)


def _not_a_prefix(index: int) -> PromptError:
    return PromptError(
        f"the chat template renders message {index} differently once later messages follow "
        "it, so cache ops cannot name it"
    )
