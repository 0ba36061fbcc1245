"""The one exception a replica endpoint raises to refuse a request."""

from __future__ import annotations


class RequestError(Exception):
    """A request the replica refuses: HTTP status, message and the offending parameter."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        if param and status == 400 and param.split(".")[-1] not in message:
            message = f"{param}: {message}"  # the message alone names the field, too
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


__all__ = ["RequestError"]
