"""Block counts of a request, for the plugins that score in blocks rather than tokens.

Several peers score a pod by *blocks*: the share of the request's blocks a pod holds (llm-d,
the Gateway API Inference Extension) or the blocks it would prefill (Dynamo). kvgate's cost
model counts tokens and applies vLLM's last-token rule; these helpers give the plain block view:

- ``request_blocks``: the request's full blocks (its block keys; without keys, the whole blocks
  of the prompt);
- ``held_blocks``: the pod's leading matched blocks, never more than the request has;
- ``split_holders``: the candidates holding at least a share of the request's blocks, and the
  others (the stickiness rule of ``prefix-cache-affinity``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.scoring.base import CycleState, EndpointSnapshot, MatchedBlocks, RoutingRequest


def request_blocks(request: RoutingRequest) -> int:
    """Full blocks of the request: its block keys, or prompt tokens // block tokens."""
    if request.block_keys:
        return len(request.block_keys)
    bs = request.block_tokens if request.block_tokens > 0 else 1
    return max(0, request.prompt_tokens) // bs


def held_blocks(matched_blocks: MatchedBlocks, endpoint_id: str, total_blocks: int) -> int:
    """The pod's leading matched blocks, clamped to [0, total_blocks]."""
    held = matched_blocks.get(endpoint_id, 0)
    if held <= 0:
        return 0
    return held if held < total_blocks else total_blocks


def split_holders(
    state: CycleState, candidates: Sequence[EndpointSnapshot], share: float
) -> tuple[list[EndpointSnapshot], list[EndpointSnapshot]]:
    """(holders, others): holders hold at least ``share`` of the request's full blocks. A
    request without full blocks has no holders."""
    total = request_blocks(state.request)
    if total <= 0:
        return [], list(candidates)
    matched = state.matched_blocks
    holders: list[EndpointSnapshot] = []
    others: list[EndpointSnapshot] = []
    for e in candidates:
        (holders if held_blocks(matched, e.id, total) >= share * total else others).append(e)
    return holders, others
