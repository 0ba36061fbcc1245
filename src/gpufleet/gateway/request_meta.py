"""Read what routing needs from a request body, without changing the body.

The body is parsed only to find `model`, `stream`, `user` and the prompt; the gateway
forwards the original bytes. Wrong shapes are refused here with a 400 naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass(slots=True)
class RequestMeta:
    model: str
    stream: bool
    user: str | None
    body: dict[str, Any]


def parse_body(raw: bytes, endpoint: str) -> RequestMeta:
    """The routing fields of a /v1/chat/completions or /v1/completions body, or BadRequest."""
    if not raw:
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # nesting deeper than the parser's stack
        raise BadRequest("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest(
            "'model' is required and must be a non-empty string"
            if model is None
            else f"'model' must be a string, not {type(model).__name__}",
            param="model",
        )
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, not {type(stream).__name__}", param="stream")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest(f"'user' must be a string, not {type(user).__name__}", param="user")
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of messages", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise BadRequest(f"'messages[{i}]' must be an object", param=f"messages[{i}]")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or prompt == "" or prompt == []:
            raise BadRequest("'prompt' must be a non-empty string or list", param="prompt")
    return RequestMeta(model=model, stream=stream, user=user, body=body)
