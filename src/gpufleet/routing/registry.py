"""Build a routing policy by name: one fresh, independent object per call (per tenant)."""

from __future__ import annotations

import inspect
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
    params = inspect.signature(cls.__init__).parameters
    return tuple(p for p in params if p not in ("self", "seed"))


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
