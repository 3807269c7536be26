"""Base model for plugin and policy parameters: typed, immutable, unknown keys rejected."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictParams(BaseModel):
    """Parameters of a scoring plugin or policy. A typo in a config key fails at load."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(StrictParams):
    """For plugins without parameters."""
