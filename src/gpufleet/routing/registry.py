"""Build a routing policy by name: one fresh, independent object per call (per tenant)."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.routing.base import PolicyBase
from gpufleet.routing.lora_affinity import LoraAffinity
from gpufleet.routing.prefix_aware import PrefixAware
from gpufleet.routing.queue_depth import QueueDepth
from gpufleet.routing.session import SessionAffinity
from gpufleet.routing.simple import LeastOutstanding, PowerOfTwo, RandomChoice, RoundRobin
from gpufleet.routing.types import RoutingPolicy

_POLICIES: dict[str, type[PolicyBase]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        RandomChoice,
        LeastOutstanding,
        PowerOfTwo,
        QueueDepth,
        SessionAffinity,
        PrefixAware,
        LoraAffinity,
    )
}

POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)


def policy_options(name: str) -> tuple[str, ...]:
    """The keyword options a policy accepts besides `seed` (for config validation)."""
    cls = _policy_class(name)
    return tuple(p for p in _init_params(cls) if p not in ("self", "seed"))


def _init_params(cls: type) -> list[str]:
    """The names `cls.__init__` takes. Compiled with mypyc (tools/compile_sim.py), a class
    keeps no signature (`*args, **kwargs`): read from the class's source then."""
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()  # type: ignore[misc]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return [p.name for p in params]
        source = (
            Path(inspect.getfile(sys.modules[klass.__module__])).with_suffix("").with_suffix(".py")
        )
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == klass.__name__:
                init = next(
                    f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"
                )
                a = init.args
                return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return []


def make_policy(name: str, *, seed: int | None = None, **options: Any) -> RoutingPolicy:
    """A new policy named `name` (one of POLICY_NAMES) with its own state and RNG.

    Unknown names or options raise `UserError` naming the field and the valid choices.
    """
    cls = _policy_class(name)
    allowed = policy_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise UserError(
            f"unknown option(s) {', '.join(unknown)} for policy {name!r}",
            field=f"policy_options.{unknown[0]}",
            fix=f"use one of: {', '.join(allowed)}" if allowed else f"{name} takes no options",
        )
    try:
        return cls(seed=seed, **options)
    except (TypeError, ValueError) as exc:
        raise UserError(str(exc), field="policy_options", fix="check the option values") from exc


def _policy_class(name: str) -> type[PolicyBase]:
    cls = _POLICIES.get(name)
    if cls is None:
        raise UserError(
            f"unknown routing policy {name!r}",
            field="policy",
            fix=f"use one of: {', '.join(POLICY_NAMES)}",
        )
    return cls
