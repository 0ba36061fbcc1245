"""Scaling policies by name, built from a plain dict of parameters (the fleet config)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpufleet.autoscale.decision import ReplicaBounds, ScalingPolicy
from gpufleet.autoscale.policies.default import DefaultPolicy
from gpufleet.autoscale.policies.hpa import HpaPolicy
from gpufleet.autoscale.policies.kpa import KpaPolicy
from gpufleet.autoscale.policies.queue_depth import QueueDepthPolicy
from gpufleet.autoscale.policies.ray_serve import RayServePolicy
from gpufleet.errors import UserError

POLICIES: dict[str, type] = {
    "default": DefaultPolicy,
    "queue_depth": QueueDepthPolicy,
    "hpa": HpaPolicy,
    "kpa": KpaPolicy,
    "ray_serve": RayServePolicy,
}


def policy_params(name: str) -> list[str]:
    """The public parameters a policy takes (besides bounds)."""
    cls = POLICIES[name]
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and not f.name.startswith("_") and f.name not in ("bounds", "name")
    ]


def make_policy(
    name: str, bounds: ReplicaBounds, params: Mapping[str, Any] | None = None
) -> ScalingPolicy:
    if name not in POLICIES:
        raise UserError(
            f"unknown policy {name!r}",
            field="autoscale.policy",
            fix=f"one of {', '.join(POLICIES)}",
        )
    allowed = policy_params(name)
    params = dict(params or {})
    for key in params:
        if key not in allowed:
            raise UserError(
                f"{name} has no parameter {key!r}",
                field=f"autoscale.params.{key}",
                fix=f"one of {', '.join(allowed)}",
            )
    try:
        policy: ScalingPolicy = POLICIES[name](bounds=bounds, **params)
    except TypeError as e:
        raise UserError(str(e), field="autoscale.params", fix="check the parameter types") from e
    return policy


__all__ = [
    "POLICIES",
    "DefaultPolicy",
    "HpaPolicy",
    "KpaPolicy",
    "QueueDepthPolicy",
    "RayServePolicy",
    "make_policy",
    "policy_params",
]
