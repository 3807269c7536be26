"""A secret as the router's config names it: inline, in a file (a mounted Kubernetes Secret) or
in an environment variable (a RoutingPolicy's Secret key, which the operator hands to the router
that way)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import model_validator

from kvgate.api.sections import ConfigModel


class SecretRef(ConfigModel):
    """A secret value: exactly one of `value`, `file` (e.g. a mounted Secret key) or `env`."""

    value: str | None = None
    file: str | None = None
    env: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        given = [x for x in (self.value, self.file, self.env) if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of value, file, env")
        return self

    def read(self) -> str:
        """The secret's value; a file's trailing newline is stripped. Raises ValueError if unset."""
        if self.value is not None:
            return self.value
        if self.file is not None:
            try:
                return Path(self.file).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise ValueError(f"cannot read secret file {self.file}: {exc}") from exc
        assert self.env is not None
        found = os.environ.get(self.env)
        if found is None:
            raise ValueError(f"environment variable {self.env} is not set")
        return found
