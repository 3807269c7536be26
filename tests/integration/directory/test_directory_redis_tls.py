"""The Redis backend over TLS, configured as users deploy it: a real redis-server listening only on
`--tls-port` with a certificate from a throwaway CA (made with openssl), a password, and the
router's configuration naming the URL by a secret and the CA bundle by a file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from tests.integration.conftest import RedisServer, TlsFiles, make_tls_files
from tests.unit.directory.conformance import (
    APPROX_CAP,
    CAP,
    BlockIndexConformance,
    FakeClock,
    chain,
)

from kvgate.api.router_config import DirectoryConfig
from kvgate.directory.factory import create_index, redis_connection
from kvgate.directory.redis import RedisBlockIndex

PASSWORD = "s3cr3t/with:odd@chars"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles
) -> Iterator[RedisServer]:
    server = RedisServer(
        tmp_path_factory.mktemp("redis-tls"), tls=tls_files, extra_args=["--requirepass", PASSWORD]
    )
    server.start()
    yield server
    server.stop()


def _authed_url(server: RedisServer) -> str:
    return f"rediss://:{quote(PASSWORD, safe='')}@127.0.0.1:{server.port}/0"


def directory_config(
    server: RedisServer, ca: Path, monkeypatch: pytest.MonkeyPatch
) -> DirectoryConfig:
    """URL (with the password) from an environment variable, as the operator hands a Secret."""
    monkeypatch.setenv("REDIS_URL_FROM_SECRET", _authed_url(server))
    return DirectoryConfig.model_validate(
        {
            "backend": "redis",
            "redis": {
                "url_secret": {"env": "REDIS_URL_FROM_SECRET"},
                "ca_bundle": {"file": str(ca)},
                "key_prefix": "tls",
            },
        }
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def index(
    tls_server: RedisServer,
    tls_files: TlsFiles,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[RedisBlockIndex]:
    # FLUSHALL needs the password: through the index's own client.
    config = directory_config(tls_server, tls_files.ca, monkeypatch)
    idx = RedisBlockIndex.connect(
        redis_connection(config.redis),
        "ns/pool",
        key_prefix="tls",
        max_blocks_per_pod=CAP,
        max_approximate_per_pod=APPROX_CAP,
        clock=clock,
    )
    await (await idx._ready()).flushall()
    yield idx
    await idx.close()


class TestRedisOverTlsConformance(BlockIndexConformance):
    pass


async def test_the_configured_index_speaks_tls_with_the_ca(
    tls_server: RedisServer, tls_files: TlsFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = create_index(directory_config(tls_server, tls_files.ca, monkeypatch), "ns/other")
    try:
        await index.add("a", chain(5), generation="g")
        assert await index.lookup(chain(5)) == {"a": 5}
    finally:
        await index.close()


async def test_a_server_signed_by_another_ca_is_refused(
    tls_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other_ca = make_tls_files(tmp_path / "other").ca
    index = create_index(directory_config(tls_server, other_ca, monkeypatch), "ns/other")
    try:
        with pytest.raises(RedisConnectionError, match="certificate verify failed"):
            await index.lookup(chain(2))
    finally:
        await index.close()


async def test_plain_redis_to_a_tls_port_fails_and_names_no_secret(
    tls_server: RedisServer, tls_files: TlsFiles
) -> None:
    config = DirectoryConfig.model_validate(
        {
            "backend": "redis",
            "redis": {
                "url": f"redis://127.0.0.1:{tls_server.port}/0",
                "socket_timeout_seconds": 1.0,
            },
        }
    )
    index = create_index(config, "ns/other")
    try:
        with pytest.raises(RedisConnectionError):
            await index.lookup(chain(2))
    finally:
        await index.close()
    with pytest.raises(ValueError, match="needs a rediss://"):
        redis_connection(
            DirectoryConfig.model_validate(
                {"redis": {"url": "redis://h:1/0", "ca_bundle": {"file": str(tls_files.ca)}}}
            ).redis
        )
