"""`kvgate operator`: flags become kopf.run arguments and operator settings."""

from __future__ import annotations

import argparse
from typing import Any

import kopf
import pytest

from kvgate.operator import command


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: seen.update(kwargs))
    assert command.run(parse(*argv)) == 0
    return seen


def test_defaults_watch_every_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = run(monkeypatch)
    assert seen["clusterwide"] is True and seen["namespaces"] == []
    assert seen["standalone"] is False
    assert seen["memo"].operator_settings.resync_seconds == 30.0


def test_namespaces_standalone_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = run(
        monkeypatch,
        "-n",
        "a",
        "--namespace",
        "b",
        "--standalone",
        "--resync-seconds",
        "2",
        "--router-image",
        "kvgate:dev",
        "--cleanup-timeout-seconds",
        "1.5",
        "--liveness",
        "http://127.0.0.1:8080/healthz",
    )
    assert seen["clusterwide"] is False and seen["namespaces"] == ["a", "b"]
    assert seen["standalone"] is True
    assert seen["liveness_endpoint"] == "http://127.0.0.1:8080/healthz"
    settings = seen["memo"].operator_settings
    assert (settings.resync_seconds, settings.router_image, settings.cleanup_timeout_seconds) == (
        2.0,
        "kvgate:dev",
        1.5,
    )
    assert settings.namespaces == ("a", "b")


def test_environment_provides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_ROUTER_IMAGE", "registry/kvgate:1")
    monkeypatch.setenv("KVGATE_OPERATOR_RESYNC_SECONDS", "7")
    args = parse()
    assert (args.router_image, args.resync_seconds) == ("registry/kvgate:1", 7.0)


def test_the_identity_needs_no_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's own identity asks getpass.getuser(): a KeyError for a UID without a passwd
    entry (the chart's runAsUser 65532 in an image without that user) crashed the operator."""
    import getpass

    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setattr(getpass, "getuser", no_user)
    monkeypatch.delenv("POD_ID", raising=False)
    assert run(monkeypatch)["identity"]
    monkeypatch.setenv("POD_ID", "kvgate-operator-7d9f")
    assert run(monkeypatch)["identity"] == "kvgate-operator-7d9f"
