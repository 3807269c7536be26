"""Errors in the OpenAI shape: `{"error": {"message", "type", "code", "param"}}` with a status
(on Anthropic's Messages API routes, in its shape: `anthropic_error_body`).

Client mistakes are 4xx (`invalid_request_error`, `authentication_error`, ...); the router's or
the pods' failures are 5xx (`server_error`, `upstream_error`, `service_unavailable`).
"""

from __future__ import annotations

import json
import math
from typing import Any


class RouterError(Exception):
    """An error answered to the client. Raise it anywhere on the request path."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after_seconds = retry_after_seconds  # sent as `retry-after` (whole seconds)

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers: `retry-after` when the client should come back later."""
        if self.retry_after_seconds is None:
            return []
        return [(b"retry-after", str(max(1, math.ceil(self.retry_after_seconds))).encode())]

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)


MAX_SHOWN_CHARS = 100


def shown(value: object) -> str:
    """A client's value in an error message, cut to `MAX_SHOWN_CHARS` (a 13 MiB model name
    made a 40 MiB answer)."""
    text = str(value)
    return text if len(text) <= MAX_SHOWN_CHARS else f"{text[:MAX_SHOWN_CHARS]}..."


def error_body(
    message: str, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "code": code, "param": param}}


_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """An error in the shape of Anthropic's Messages API (`/v1/messages`), whose clients read
    it: `{"type": "error", "error": {"type", "message"}}`."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_bytes(message: str, type: str, code: str | None = None) -> bytes:
    return json.dumps(error_body(message, type, code)).encode()


def bad_request(
    message: str, *, code: str = "invalid_request", param: str | None = None
) -> RouterError:
    return RouterError(400, message, code=code, param=param)


def not_found_response(response_id: str, param: str) -> RouterError:
    """vLLM's answer for a stored response it does not hold (the id shown cut to 80 chars)."""
    return RouterError(404, f"Response with id '{response_id[:80]}' not found.", param=param)


def unavailable(message: str, *, code: str = "no_endpoint") -> RouterError:
    return RouterError(503, message, type="service_unavailable", code=code)


def overloaded(message: str, *, code: str, retry_after_seconds: float) -> RouterError:
    """429: the router holds too much already, or the request could not start in time."""
    return RouterError(
        429, message, type="rate_limit_error", code=code, retry_after_seconds=retry_after_seconds
    )
