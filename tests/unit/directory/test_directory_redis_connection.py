"""How the Redis connection is built from the configuration (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster

from kvgate.api.router_config import DirectoryConfig
from kvgate.directory.factory import redis_connection
from kvgate.directory.redis import RedisConnection
from kvgate.directory.redis_url import redacted_url


def config(**redis: object) -> DirectoryConfig:
    return DirectoryConfig.model_validate({"backend": "redis", "redis": redis})


def test_the_url_comes_from_a_secret_and_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("URL", "rediss://user:pw@managed.example:6380/0\n")
    connection = redis_connection(config(url_secret={"env": "URL"}).redis)
    assert connection.url == "rediss://user:pw@managed.example:6380/0"
    assert connection.password is None and not connection.cluster


def test_ca_bundle_is_read_from_its_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n...\n")
    connection = redis_connection(
        config(url="rediss://r:6380/0", ca_bundle={"file": str(ca)}, cluster=True).redis
    )
    assert connection.ca_pem == ca.read_text().rstrip("\n") and connection.cluster
    assert isinstance(connection.client(1.0), RedisCluster)


def test_bad_settings_are_named_without_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("URL", "http://user:hunter2@h/0")
    with pytest.raises(ValueError, match=r"redis\.url_secret: Redis URL must be") as error:
        redis_connection(config(url_secret={"env": "URL"}).redis)
    assert "hunter2" not in str(error.value)
    with pytest.raises(ValueError, match=r"redis\.ca_bundle: cannot read"):
        redis_connection(
            config(url="rediss://r:1/0", ca_bundle={"file": "/nonexistent/ca.crt"}).redis
        )
    with pytest.raises(ValueError, match="needs a rediss://"):
        RedisConnection("redis://r:1/0", ca_pem="x")
    with pytest.raises(ValueError, match="rediss"):
        config(url="http://r:1/0")
    with pytest.raises(ValueError, match="not unix://"):
        RedisConnection("unix:///run/redis.sock", cluster=True)
    assert RedisConnection("unix:///run/redis.sock").url.startswith("unix://")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("rediss://user:pw@h:6380/0", "rediss://user:***@h:6380/0"),
        ("redis://:pw@h:6379/1", "redis://:***@h:6379/1"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_redacted_url(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
