"""Plugins and policies by name: a registry that validates typed parameters and fails loudly.

Names are kebab-case (``prefix-cache``, ``near-equal``). Registering a name twice in the same
kind raises :class:`RegistryError`; so does building an unknown name (the message lists the
known ones). Parameters are given as a plain mapping (from YAML) and validated against the
plugin's ``Params`` model (pydantic, unknown keys rejected): a bad config fails at load, not at
the first request. :func:`default_registry` returns a fresh registry holding every built-in;
there is no global one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from kvgate.scoring.base import Filter, Picker, Policy, Scorer
from kvgate.scoring.builtins import register_builtins
from kvgate.scoring.params import StrictParams

PluginKind = Literal["filter", "scorer", "picker", "policy"]
_KEBAB = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")

T = TypeVar("T")


class RegistryError(ValueError):
    """Duplicate or unknown plugin name, or an invalid one."""


@dataclass(frozen=True, slots=True)
class Registration(Generic[T]):
    name: str
    kind: PluginKind
    params_model: type[StrictParams]
    factory: Callable[[Any], T]  # called with a validated params_model instance
    summary: str


class PluginRegistry:
    """Named factories for filters, scorers, pickers and policies."""

    def __init__(self) -> None:
        self._filters: dict[str, Registration[Filter]] = {}
        self._scorers: dict[str, Registration[Scorer]] = {}
        self._pickers: dict[str, Registration[Picker]] = {}
        self._policies: dict[str, Registration[Policy]] = {}

    # -- registration -----------------------------------------------------------------------

    def add_filter(
        self, name: str, params: type[StrictParams], factory: Callable[[Any], Filter], summary: str
    ) -> None:
        self._add(self._filters, Registration(name, "filter", params, factory, summary))

    def add_scorer(
        self, name: str, params: type[StrictParams], factory: Callable[[Any], Scorer], summary: str
    ) -> None:
        self._add(self._scorers, Registration(name, "scorer", params, factory, summary))

    def add_picker(
        self, name: str, params: type[StrictParams], factory: Callable[[Any], Picker], summary: str
    ) -> None:
        self._add(self._pickers, Registration(name, "picker", params, factory, summary))

    def add_policy(
        self, name: str, params: type[StrictParams], factory: Callable[[Any], Policy], summary: str
    ) -> None:
        self._add(self._policies, Registration(name, "policy", params, factory, summary))

    @staticmethod
    def _add(table: dict[str, Registration[T]], reg: Registration[T]) -> None:
        if not _KEBAB.match(reg.name):
            raise RegistryError(f"{reg.kind} name {reg.name!r} is not kebab-case")
        if reg.name in table:
            raise RegistryError(f"{reg.kind} {reg.name!r} is already registered")
        table[reg.name] = reg

    # -- lookup ------------------------------------------------------------------------------

    def filter(self, name: str, params: Mapping[str, Any] | None = None) -> Filter:
        return self._build(self._filters, "filter", name, params)

    def scorer(self, name: str, params: Mapping[str, Any] | None = None) -> Scorer:
        return self._build(self._scorers, "scorer", name, params)

    def picker(self, name: str, params: Mapping[str, Any] | None = None) -> Picker:
        return self._build(self._pickers, "picker", name, params)

    def policy(self, name: str, params: Mapping[str, Any] | None = None) -> Policy:
        return self._build(self._policies, "policy", name, params)

    def params_model(self, kind: PluginKind, name: str) -> type[StrictParams]:
        return self._get(self._table(kind), kind, name).params_model

    def names(self, kind: PluginKind) -> list[str]:
        return sorted(self._table(kind))

    def summaries(self, kind: PluginKind) -> dict[str, str]:
        return {n: r.summary for n, r in sorted(self._table(kind).items())}

    def _table(self, kind: PluginKind) -> Mapping[str, Registration[Any]]:
        tables: dict[str, Mapping[str, Registration[Any]]] = {
            "filter": self._filters,
            "scorer": self._scorers,
            "picker": self._pickers,
            "policy": self._policies,
        }
        return tables[kind]

    @staticmethod
    def _get(table: Mapping[str, Registration[T]], kind: str, name: str) -> Registration[T]:
        reg = table.get(name)
        if reg is None:
            known = ", ".join(sorted(table)) or "none"
            raise RegistryError(f"unknown {kind} {name!r} (known: {known})")
        return reg

    def _build(
        self,
        table: Mapping[str, Registration[T]],
        kind: str,
        name: str,
        params: Mapping[str, Any] | None,
    ) -> T:
        reg = self._get(table, kind, name)
        validated = reg.params_model.model_validate(dict(params or {}))
        return reg.factory(validated)


def default_registry() -> PluginRegistry:
    """A new registry with every built-in plugin and policy."""
    registry = PluginRegistry()
    register_builtins(registry)
    return registry


def build_policy(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    registry: PluginRegistry | None = None,
    max_affinity_wait_seconds: float | None = None,
) -> Policy:
    """Build a policy from config (``RouterConfig.policy``: name, params, top-level cap).

    ``max_affinity_wait_seconds`` is passed to policies that have that parameter, unless
    ``params`` sets it; other policies ignore it.
    """
    reg = registry or default_registry()
    merged = dict(params or {})
    if (
        max_affinity_wait_seconds is not None
        and "max_affinity_wait_seconds" in reg.params_model("policy", name).model_fields
    ):
        merged.setdefault("max_affinity_wait_seconds", max_affinity_wait_seconds)
    return reg.policy(name, merged)
