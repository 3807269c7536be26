"""Multi-LoRA serving in the simulated engine, as vLLM 0.33 does it.

- Adapters are declared at start (``--enable-lora --lora-modules name=path ...``); clients name
  one as the request's ``model``. Ids are 1, 2, ... in declaration order (vLLM's static LoRAs).
- Block hashes of an adapter's request carry ``("lora", name, path)`` on every block
  (``kv_cache_utils._gen_lora_extra_hash_keys``), so an adapter never shares KV blocks with the
  base model or another adapter; KV events carry ``lora_id``, ``lora_name`` and, in the
  untagged event form, the adapter name in each block's ``extra_keys``.
- A batch uses at most ``--max-loras`` distinct adapters: a waiting request of another adapter
  is skipped (it keeps its place in the queue) until a running one finishes
  (``Scheduler.schedule``'s max_loras check).
- ``max_loras`` GPU slots hold adapter weights (LRU); a step that uses an adapter not in a slot
  first loads it, which costs ``load_seconds`` (``--sim-lora-load-seconds``).
- ``vllm:lora_requests_info`` (a gauge set to the current time, labels ``max_lora``,
  ``running_lora_adapters``, ``waiting_lora_adapters``: comma-joined adapter names) is what the
  engine reports; the router reads the newest series.
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvgate.prefix import LoraKey


@dataclass(frozen=True, slots=True)
class LoraModule:
    name: str
    path: str
    id: int  # vLLM's lora_int_id (1-based)

    @property
    def key(self) -> LoraKey:
        return LoraKey(self.name, self.path)


@dataclass
class LoraConfig:
    modules: list[LoraModule] = field(default_factory=list)
    max_loras: int = 1
    load_seconds: float = 0.05


def parse_lora_module(text: str) -> tuple[str, str]:
    """One ``--lora-modules`` item: ``name=path`` or JSON ``{"name": ..., "path": ...}``."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"--lora-modules item is not JSON: {exc}") from exc
        if not isinstance(data, dict) or not {"name", "path"} <= set(data):
            raise argparse.ArgumentTypeError("--lora-modules JSON needs `name` and `path`")
        return str(data["name"]), str(data["path"])
    name, sep, path = text.partition("=")
    if not sep or not name or not path or "=" in path:
        raise argparse.ArgumentTypeError(f"--lora-modules item {text!r} is not name=path")
    return name, path


def lora_config(
    enabled: bool, modules: Iterable[tuple[str, str]] | None, max_loras: int, load_seconds: float
) -> LoraConfig | None:
    items = list(modules or [])
    if items and not enabled:
        raise ValueError("--lora-modules needs --enable-lora")
    if not enabled:
        return None
    if max_loras < 1:
        raise ValueError("--max-loras must be >= 1")
    if load_seconds < 0:
        raise ValueError("--sim-lora-load-seconds must be >= 0")
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise ValueError("--lora-modules names must be unique")
    return LoraConfig(
        modules=[LoraModule(n, p, i) for i, (n, p) in enumerate(items, start=1)],
        max_loras=max_loras,
        load_seconds=load_seconds,
    )


class LoraSlots:
    """The ``max_loras`` GPU adapter slots, least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slots: OrderedDict[str, None] = OrderedDict()

    def use(self, names: Iterable[str]) -> int:
        """Mark `names` (one batch's adapters, at most `capacity`) used; returns how many had to
        be loaded into a slot first."""
        loads = 0
        for name in names:
            if name in self._slots:
                self._slots.move_to_end(name)
                continue
            loads += 1
            self._slots[name] = None
            while len(self._slots) > self.capacity:
                self._slots.popitem(last=False)
        return loads

    def clear(self) -> None:
        self._slots.clear()
