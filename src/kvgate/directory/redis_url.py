"""Redis URLs in messages: never with their password (it may come from a Secret).

Kept apart from `redis.py` so that what shows a URL (the operator's events) need not import the
Redis client.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redacted_url(url: str) -> str:
    """`url` with its password (if any) replaced by `***`: for logs and events."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}***@{host}"))
