r"""The named workloads of ``kvgate bench run --workload NAME`` and their parameters.

Every workload has a pydantic ``Params`` model whose defaults are the published profile; any
field can be overridden (``--param num_groups=8``) to scale a workload down for tests and the demo.

| name            | builder                                   | defaults                        |
|-----------------|-------------------------------------------|---------------------------------|
| shared-prefix   | :func:`shared_prefix.build_shared_prefix` | SGLang generated-shared-prefix  |
| precise-prefix  | :func:`shared_prefix.build_shared_prefix` | llm-d precise-prefix profile    |
| agent-sessions  | :func:`agent_sessions.build_agent_sessions` | 32 SWE-agent sessions         |
| hot-prefix      | :func:`synthetic.build_hot_prefix`        | 90% of requests on one prefix   |
| mixed           | :func:`synthetic.build_mixed`             | online chat + batch documents   |
| long-agent-sessions | :func:`long_agent.build_long_agent_sessions` | 8 x 300-turn sessions, context=full, summarise or akv |

Mooncake-format traces (Mooncake's, Alibaba's Bailian traces, aiperf's and Dynamo's) are read with
``--trace FILE`` (:mod:`kvgate.bench.mooncake`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvgate.bench.agent_sessions import AgentSessionParams, ChatTokenizer, build_agent_sessions
from kvgate.bench.long_agent import LongAgentParams, build_long_agent_sessions
from kvgate.bench.mooncake import (
    TraceParams,
    build_trace_workload,
    read_trace_file,
    rows_needed,
)
from kvgate.bench.shared_prefix import LLMD_PRECISE_PREFIX, SharedPrefixParams, build_shared_prefix
from kvgate.bench.synthetic import HotPrefixParams, MixedParams, build_hot_prefix, build_mixed
from kvgate.bench.workload import Workload

WORKLOAD_NAMES = (
    "shared-prefix",
    "precise-prefix",
    "agent-sessions",
    "hot-prefix",
    "mixed",
    "long-agent-sessions",
)


class UnknownWorkloadError(ValueError):
    pass


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; pydantic converts the values."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--param expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def nested_params(pairs: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=\"x\""]`` -> ``{"a": {"b": 1}, "c": "x"}`` (values are JSON, else text)."""
    out: dict[str, Any] = {}
    for key, raw in parse_overrides(pairs).items():
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _none_aware(overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (None if v in ("none", "None", "") else v) for k, v in overrides.items()}


def build_workload(
    name: str,
    overrides: Mapping[str, Any] | None = None,
    tokenize: ChatTokenizer | None = None,
) -> Workload:
    """Build a named workload with some parameters overridden."""
    values = _none_aware(overrides or {})
    if name == "shared-prefix":
        return build_shared_prefix(SharedPrefixParams.model_validate(values), name)
    if name == "precise-prefix":
        merged = LLMD_PRECISE_PREFIX.model_dump() | values
        return build_shared_prefix(SharedPrefixParams.model_validate(merged), name)
    if name == "agent-sessions":
        return build_agent_sessions(AgentSessionParams.model_validate(values), tokenize, name)
    if name == "hot-prefix":
        return build_hot_prefix(HotPrefixParams.model_validate(values), name)
    if name == "mixed":
        return build_mixed(MixedParams.model_validate(values), name)
    if name == "long-agent-sessions":
        return build_long_agent_sessions(LongAgentParams.model_validate(values), name)
    raise UnknownWorkloadError(
        f"unknown workload {name!r}; choose from {', '.join(WORKLOAD_NAMES)}"
    )


def build_trace(
    path: Path, overrides: Mapping[str, Any] | None = None, tokenizer: str | None = None
) -> Workload:
    """Replay a Mooncake-format JSONL trace; rows that carry their prompt are tokenized with the
    ``tokenizer`` folder's tokenizer (default: the simulator's codec)."""
    params = TraceParams.model_validate(_none_aware(overrides or {}))
    rows = read_trace_file(path, max_rows=rows_needed(params))
    return build_trace_workload(rows, params, name=path.stem, tokenizer=tokenizer)
