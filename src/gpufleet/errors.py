"""Errors a user can act on: each names what is wrong and how to fix it."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input (flag, config file, model config).

    `field` names the offending field or flag; `fix` says what to do instead.
    The CLI prints these without a traceback and exits with status 2.
    """

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None):
        self.message = message
        self.field = field
        self.fix = fix
        parts = [f"{field}: {message}" if field else message]
        if fix:
            parts.append(f"fix: {fix}")
        super().__init__(" — ".join(parts))
