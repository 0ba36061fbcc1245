"""OpenAI-format error bodies, shared by the replica server and the gateway.

Every refusal in gpufleet is `{"error": {"message", "type", "param", "code"}}` with
the HTTP status that matches it, as OpenAI and vLLM answer.
"""

from __future__ import annotations

import json
from typing import Any

# HTTP status -> OpenAI error type, as the OpenAI API and vLLM use them.
ERROR_TYPE_BY_STATUS: dict[int, str] = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "TimeoutError",
    413: "BadRequestError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_body(
    message: str,
    status: int,
    *,
    error_type: str | None = None,
    param: str | None = None,
    code: str | int | None = None,
) -> dict[str, Any]:
    """The JSON body of an OpenAI-format error, in vLLM's shape: `code` is the HTTP status.

    A symbolic code (e.g. "model_not_found") is kept in the message, so a person still
    reads it, while every client sees the same shape from the gateway and the replica.
    """
    if isinstance(code, str) and code not in message:
        message = f"{message} ({code})"
    return {
        "error": {
            "message": message,
            "type": error_type or ERROR_TYPE_BY_STATUS.get(status, "APIError"),
            "param": param,
            "code": status,
        }
    }


def error_json_bytes(message: str, status: int, **kwargs: Any) -> bytes:
    return json.dumps(error_body(message, status, **kwargs)).encode()


def sse_error_event(message: str, status: int, **kwargs: Any) -> bytes:
    """An error as one server-sent event, followed by the stream terminator."""
    payload = json.dumps(error_body(message, status, **kwargs))
    return f"data: {payload}\n\ndata: [DONE]\n\n".encode()
