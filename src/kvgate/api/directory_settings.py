"""The `directory` section, shared by the router's config file and the RoutingPolicy CRD (the
conventions of `kvgate.api.sections`): where the router keeps which pod holds which blocks, and
how it reaches Redis."""

from __future__ import annotations

from typing import Generic, Literal

from pydantic import ConfigDict, Field, model_validator

from kvgate.api.base import cel, section
from kvgate.api.sections import ConfigModel, DataT, SecretT


class RedisSettings(ConfigModel, Generic[SecretT, DataT]):
    """Connection to the Redis directory: one server or a Redis Cluster, optionally over TLS."""

    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        min_length=1,
        pattern=r"^(rediss?|unix)://",
        description="Redis URL without the password (that is `password`), e.g. "
        "redis://kvgate-redis.kvgate-system.svc:6379/0 for the Helm chart's Redis; rediss:// "
        "for TLS, unix:// for a socket. With cluster, any one node (database 0).",
    )
    url_secret: SecretT | None = Field(
        default=None,
        description="The URL from a secret instead of `url` (it may carry credentials, "
        "rediss://user:password@host:6380/0, as managed Redis services hand it out).",
    )
    key_prefix: str = Field(default="kvgate", min_length=1, description="Prefix of every key.")
    password: SecretT | None = Field(
        default=None, description="The Redis password (a secret); overrides one in the URL."
    )
    cluster: bool = Field(
        default=False,
        description="Redis Cluster: the client discovers the nodes from the URL's, routes each "
        "pool's calls to the master of its hash slot and follows failovers.",
    )
    ca_bundle: DataT | None = Field(
        default=None,
        description="PEM CA bundle that signs the server's TLS certificate (rediss:// only), "
        "read when the directory connects; default: the system's trust store.",
    )
    socket_timeout_seconds: float = Field(
        default=0.5,
        gt=0.0,
        description="Per-call timeout (default 0.5): a call that times out is answered from the "
        "router's local view, so this is the most a Redis stall adds to a request; too short and "
        "a healthy Redis on a loaded machine counts as down (50 ms did).",
    )
    resync_interval_seconds: float = Field(
        default=1.0,
        gt=0.0,
        description="How often an index that lost shared writes (or lookups) retries Redis and "
        "rebuilds them (default 1).",
    )


class DirectorySettings(ConfigModel, Generic[SecretT, DataT]):
    """Where the router keeps which pod holds which blocks."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.embeddedIndexer) || self.embeddedIndexer || "
                    "(has(self.backend) && self.backend == 'redis')",
                    "embeddedIndexer: false needs backend: redis (a separate `kvgate indexer` "
                    "can only feed a shared directory)",
                )
            ]
        }
    )

    backend: Literal["memory", "redis"] = Field(
        default="memory",
        description="Directory backend: memory (one per router replica) or redis (shared by "
        "router replicas and indexers).",
    )
    redis: RedisSettings[SecretT, DataT] = section(
        RedisSettings, "Redis connection (backend redis)."
    )
    embedded_indexer: bool = Field(
        default=True,
        description="Subscribe to KV events inside the router; false when a `kvgate indexer` "
        "feeds the Redis directory instead (a RoutingPolicy then runs one).",
    )
    approximate_ttl_seconds: float = Field(
        default=300.0,
        gt=0.0,
        description="Lifetime of routing-history entries of pods without KV events.",
    )

    @model_validator(mode="after")
    def _indexer_needs_redis(self) -> DirectorySettings[SecretT, DataT]:
        if not self.embedded_indexer and self.backend != "redis":
            raise ValueError(
                "embedded_indexer: false needs backend: redis (a separate `kvgate indexer` "
                "can only feed a shared directory)"
            )
        return self
