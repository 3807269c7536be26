"""Response ids that name the pod holding the response (OpenAI's Responses API).

vLLM keeps a stored response (`store`, with `VLLM_ENABLE_RESPONSES_API_STORE=1`) in the memory
of the pod that wrote it: a follow-up that names it (`previous_response_id`), a retrieval
(`GET /v1/responses/{id}`) and a cancel must reach that pod, and no other pod can serve them.
vLLM uses the request's `request_id` field as the response's id, so the router sets it, per
attempt, to an id that carries a tag of the chosen pod: `resp_kg` + 12 hex digits (6 bytes of
BLAKE2b of the endpoint id) + 12 hex digits of tenant scope (below) + 32 random hex digits.
Every router replica computes the same tag from the same endpoint id, so any replica sends the
follow-up where it belongs without shared state; the random part keeps the id as hard to guess
as vLLM's own.

With tenants configured, the id also carries the tag of the tenant it was written for
(`scope_tag`, 12 hex digits; `UNSCOPED` zeros without tenants): a follow-up, a retrieval or a
cancel with another tenant's key is the 404 of an unknown id, so an id seen in a log is no key
to another tenant's conversation. A client cannot move an id to its own tenant: the pod stores
the response under the whole id.

A client that sets `request_id` itself keeps it (its follow-ups are routed by their prompt like
any other request); an id of another shape is not the router's and names no pod.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from kvgate.discovery.endpoints import Endpoint

PREFIX = "resp_kg"
UNSCOPED = "0" * 12
_TAG_CHARS = 12
_RANDOM_CHARS = 32
_LENGTH = len(PREFIX) + 2 * _TAG_CHARS + _RANDOM_CHARS
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class ResponseId:
    """What a minted id names: the pod that stored the response, and the tenant it is for."""

    pod: str
    scope: str


def endpoint_tag(endpoint_id: str) -> str:
    """The tag response ids minted for `endpoint_id` carry."""
    return _tag(b"pod\0" + endpoint_id.encode("utf-8", "surrogatepass"))


def scope_tag(tenant_salt: str) -> str:
    """The tag of a tenant, from its cache salt (secret, as the tenant's cache is): ids do not
    reveal which tenant they are for, only whether two are for the same one."""
    return _tag(b"scope\0" + tenant_salt.encode("utf-8", "surrogatepass"))


def _tag(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=_TAG_CHARS // 2).hexdigest()


def mint(endpoint_id: str, scope: str = UNSCOPED) -> str:
    """A fresh response id naming `endpoint_id`, for the tenant tagged `scope`."""
    return PREFIX + endpoint_tag(endpoint_id) + scope + uuid.uuid4().hex


def parse(response_id: object) -> ResponseId | None:
    """What an id minted by a router names; None for any other value."""
    if not isinstance(response_id, str) or len(response_id) != _LENGTH:
        return None
    if not response_id.startswith(PREFIX) or not _HEX.issuperset(response_id[len(PREFIX) :]):
        return None
    at = len(PREFIX)
    return ResponseId(response_id[at : at + _TAG_CHARS], response_id[at + _TAG_CHARS : at + 24])


def tagged(endpoints: Iterable[Endpoint], tag: str) -> Endpoint | None:
    """The endpoint whose tag is `tag`, among `endpoints` (None: it has left)."""
    for ep in endpoints:
        if endpoint_tag(ep.spec.id) == tag:
            return ep
    return None
