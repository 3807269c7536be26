"""Response ids that name the pod holding the response (OpenAI's Responses API).

vLLM keeps a stored response (`store`, with `VLLM_ENABLE_RESPONSES_API_STORE=1`) in the memory
of the pod that wrote it: a follow-up that names it (`previous_response_id`), a retrieval
(`GET /v1/responses/{id}`) and a cancel must reach that pod, and no other pod can serve them.
vLLM uses the request's `request_id` field as the response's id, so the router sets it, per
attempt, to an id that carries a tag of the chosen pod: `resp_kg` + 12 hex digits (the first 6
bytes of BLAKE2b of the endpoint id) + 32 random hex digits. Every router replica computes the
same tag from the same endpoint id, so any replica sends the follow-up where it belongs without
shared state; the random part keeps the id as hard to guess as vLLM's own.

A client that sets `request_id` itself keeps it (its follow-ups are routed by their prompt like
any other request); an id of another shape is not the router's and names no pod.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable

from kvgate.discovery.endpoints import Endpoint

PREFIX = "resp_kg"
_TAG_CHARS = 12
_RANDOM_CHARS = 32
_HEX = frozenset("0123456789abcdef")


def endpoint_tag(endpoint_id: str) -> str:
    """The tag response ids minted for `endpoint_id` carry."""
    digest = hashlib.blake2b(endpoint_id.encode("utf-8", "surrogatepass"), digest_size=6)
    return digest.hexdigest()


def mint(endpoint_id: str) -> str:
    """A fresh response id naming `endpoint_id`."""
    return PREFIX + endpoint_tag(endpoint_id) + uuid.uuid4().hex


def tag_of(response_id: object) -> str | None:
    """The pod tag a response id minted by a router carries; None for any other value."""
    if not isinstance(response_id, str):
        return None
    if len(response_id) != len(PREFIX) + _TAG_CHARS + _RANDOM_CHARS:
        return None
    if not response_id.startswith(PREFIX) or not _HEX.issuperset(response_id[len(PREFIX) :]):
        return None
    return response_id[len(PREFIX) : len(PREFIX) + _TAG_CHARS]


def tagged(endpoints: Iterable[Endpoint], tag: str) -> Endpoint | None:
    """The endpoint whose tag is `tag`, among `endpoints` (None: it has left)."""
    for ep in endpoints:
        if endpoint_tag(ep.spec.id) == tag:
            return ep
    return None
