"""`--json [PATH|-]` for every verb: the figures as JSON in a file, or alone on stdout.

With `-` (or a bare `--json`) stdout carries the JSON document and nothing else; everything
a person reads (tables, progress, notes) goes to stderr instead, so
`gpufleet up --demo --json - | jq .` works.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO, TypeVar

import click

from gpufleet.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


def json_option(what: str = "every figure") -> Callable[[F], F]:
    return click.option(
        "--json",
        "json_path",
        is_flag=False,
        flag_value="-",
        default=None,
        metavar="PATH|-",
        help=f"Write {what} as JSON to PATH, or alone to stdout with '-' (or a bare --json; "
        "the human output then goes to stderr).",
    )


class JsonOut:
    """Context for a verb's run: with '-', human output is redirected to stderr."""

    def __init__(self, path: str | None):
        self.path = path
        self._stdout: TextIO = sys.stdout
        self._redirect: contextlib.AbstractContextManager[Any] | None = None

    @property
    def to_stdout(self) -> bool:
        return self.path == "-"

    def __enter__(self) -> JsonOut:
        self._stdout = sys.stdout
        if self.to_stdout:
            self._redirect = contextlib.redirect_stdout(sys.stderr)
            self._redirect.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._redirect is not None:
            self._redirect.__exit__(exc_type, exc, tb)
            self._redirect = None

    def write(self, payload: Any) -> str | None:
        """Write the document; returns the file written (None for stdout or no --json)."""
        if self.path is None:
            return None
        text = json.dumps(payload, indent=2, default=str) + "\n"
        if self.to_stdout:
            self._stdout.write(text)
            self._stdout.flush()
            return None
        try:
            Path(self.path).write_text(text)
        except OSError as e:
            raise UserError(f"cannot write {self.path}: {e.strerror}", field="--json") from None
        return self.path
