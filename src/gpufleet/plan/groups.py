"""Several model groups against one GPU budget (`gpufleet plan --groups FLEET_YAML`).

Each group is planned alone (its model, GPU, engine and traffic: the usual layout search);
its replicas are what its traffic needs, kept within the group's [min, max]; then the groups'
GPUs are summed against the shared budget, both as planned and with every group at its
max_replicas (what the autoscalers may reach together).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.plan.search import plan
from gpufleet.plan.types import Plan, PlanRequest


@dataclass(frozen=True)
class GroupDemand:
    """One group to plan: its request (model, GPU, traffic, SLOs) and replica bounds."""

    name: str
    request: PlanRequest
    min_replicas: int = 0
    max_replicas: int = 8


@dataclass(frozen=True)
class GroupPlan:
    name: str
    plan: Plan
    needed_replicas: int  # what its traffic needs at the chosen layout
    replicas: int  # needed_replicas within [min_replicas, max_replicas]
    max_replicas: int

    @property
    def gpus_per_replica(self) -> int:
        return self.plan.chosen.layout.num_gpus

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def peak_gpus(self) -> int:
        return self.max_replicas * self.gpus_per_replica

    @property
    def notes(self) -> tuple[str, ...]:
        if self.needed_replicas > self.max_replicas:
            return (
                f"--rps needs {self.needed_replicas} replicas; max_replicas "
                f"{self.max_replicas} caps it (raise max_replicas or expect queueing)",
            )
        return ()

    def to_dict(self) -> dict[str, Any]:
        req, chosen = self.plan.request, self.plan.chosen
        return {
            "name": self.name,
            "model": req.model.name,
            "gpu": req.gpu.name,
            "engine": req.engine,
            "rps": req.rps,
            "layout": chosen.layout.label,
            "gpus_per_replica": self.gpus_per_replica,
            "needed_replicas": self.needed_replicas,
            "replicas": self.replicas,
            "gpus": self.gpus,
            "max_replicas": self.max_replicas,
            "peak_gpus": self.peak_gpus,
            "slo_met": bool(chosen.performance and chosen.performance.slo_met),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class GroupsPlan:
    groups: tuple[GroupPlan, ...]
    max_gpus: int | None

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def peak_gpus(self) -> int:
        return sum(g.peak_gpus for g in self.groups)

    @property
    def fits(self) -> bool:
        return self.max_gpus is None or self.gpus <= self.max_gpus

    @property
    def fits_at_peak(self) -> bool:
        return self.max_gpus is None or self.peak_gpus <= self.max_gpus

    def verdict(self) -> str:
        if self.max_gpus is None:
            return f"{self.gpus} GPUs as planned, {self.peak_gpus} with every group at max"
        budget = f"--max-gpus {self.max_gpus}"
        if not self.fits:
            return f"does not fit: the groups need {self.gpus} GPUs for their traffic; {budget}"
        if not self.fits_at_peak:
            return (
                f"fits as planned ({self.gpus} of {self.max_gpus} GPUs), but not with every "
                f"group at max_replicas ({self.peak_gpus} GPUs): the autoscalers can ask for "
                "more than the budget"
            )
        return f"fits: {self.gpus} GPUs as planned, {self.peak_gpus} at max, {budget}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": [g.to_dict() for g in self.groups],
            "max_gpus": self.max_gpus,
            "gpus": self.gpus,
            "peak_gpus": self.peak_gpus,
            "fits": self.fits,
            "fits_at_peak": self.fits_at_peak,
            "verdict": self.verdict(),
        }


def plan_groups(demands: list[GroupDemand], max_gpus: int | None) -> GroupsPlan:
    """Plan every group; raises UserError (from `plan`) when a group's model fits nowhere."""
    out = []
    for d in demands:
        p = plan(d.request)
        needed = p.chosen.replicas or 1
        replicas = min(max(needed, d.min_replicas), d.max_replicas)
        out.append(GroupPlan(d.name, p, needed, replicas, d.max_replicas))
    return GroupsPlan(tuple(out), max_gpus)
