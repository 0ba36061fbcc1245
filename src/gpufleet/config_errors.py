"""Config-file errors a person can act on: file, line and column, the dotted key, and the
close name when a key is misspelt ("did you mean api_keys?").

`load_yaml` keeps where each key and value sits in the file; `user_error` turns pydantic's
first useful error into a `UserError` that points there.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.errors import UserError

Loc = tuple[str | int, ...]


class Positions:
    """(line, column), 1-based, of every key and value in a YAML document, by path."""

    def __init__(self, source: str):
        self.source = source
        self.keys: dict[Loc, tuple[int, int]] = {}
        self.values: dict[Loc, tuple[int, int]] = {}

    def walk(self, node: yaml.Node, loc: Loc = ()) -> None:
        self.values[loc] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else str(key.value)
                self.keys[(*loc, name)] = (key.start_mark.line + 1, key.start_mark.column + 1)
                self.walk(value, (*loc, name))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.walk(item, (*loc, i))

    def where(self, loc: Loc, key: bool = False) -> str:
        """'file:line:col' of the deepest known part of `loc`."""
        for end in range(len(loc), -1, -1):
            part = loc[:end]
            table = self.keys if key and end == len(loc) else self.values
            if part in table:
                line, col = table[part]
                return f"{self.source}:{line}:{col}"
            if part in self.keys:
                line, col = self.keys[part]
                return f"{self.source}:{line}:{col}"
        return self.source


def load_yaml(path: str | Path, flag: str) -> tuple[Any, Positions]:
    """A YAML file's data and where each key sits; UserError for a missing or broken file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise UserError(str(exc), field=flag, fix="pass an existing YAML file") from None
    positions = Positions(str(p))
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(
            f"not valid YAML: {problem}", field=where, fix="fix the YAML syntax"
        ) from None
    if node is not None:
        positions.walk(node)
    return data, positions


def dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _unwrap(annotation: Any) -> list[Any]:
    """The classes an annotation may hold (through Optional, unions, lists and dicts)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [c for a in typing.get_args(annotation) for c in _unwrap(a)]
    if origin in (list, tuple, set, frozenset):
        return [c for a in typing.get_args(annotation) for c in _unwrap(a)]
    if origin is dict:
        args = typing.get_args(annotation)
        return _unwrap(args[1]) if len(args) == 2 else []
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return [annotation]


def model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that holds the last key of `loc` (None if it is free-form)."""
    current: type[BaseModel] = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        models = [
            c for c in _unwrap(field.annotation) if isinstance(c, type) and issubclass(c, BaseModel)
        ]
        if not models:
            return None
        current = models[0]
    return current


def _suggest(name: str, options: list[str]) -> str | None:
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return close[0] if close else None


def user_error(
    exc: ValidationError,
    model: type[BaseModel],
    source: str,
    positions: Positions | None = None,
    *,
    prefix: Loc = (),
    fix: str = "see the documentation of this file",
) -> UserError:
    """The most useful of pydantic's errors, placed in the file, with the close name."""
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    err = unknown[0] if unknown else errors[0]
    loc: Loc = tuple(err["loc"])
    full = (*prefix, *loc)
    where = positions.where(full, key=err["type"] == "extra_forbidden") if positions else source
    name = dotted(full)
    place = f"{where}: {name}" if where else name
    if err["type"] == "extra_forbidden":
        holder = model_at(model, loc)
        options = sorted(holder.model_fields) if holder is not None else []
        guess = _suggest(str(loc[-1]), options)
        if guess is not None:
            hint = f"did you mean {guess}?"
            if (*loc[:-1], guess) in missing:
                hint += f" ({guess} is required here)"
            return UserError("unknown key", field=place, fix=hint)
        known = ", ".join(options) if options else "none"
        return UserError("unknown key", field=place, fix=f"known keys here: {known}")
    if err["type"] == "missing":
        return UserError("is required", field=place, fix=f"add {loc[-1]}")
    return UserError(err["msg"], field=place, fix=fix)
