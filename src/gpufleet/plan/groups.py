"""Several model groups against one GPU budget (`gpufleet plan --groups FLEET_YAML`).

Each group is planned alone (its model, GPU, engine and traffic: the usual layout search);
a group whose config states its layout (`replicas.tp` / `replicas.pp`) is costed at that
layout, since that is what `up` will start; its replicas are what its traffic needs, kept
within the group's [min, max]; then the groups' GPUs are summed against the shared budget,
both as planned and with every group at its max_replicas (what the autoscalers may reach
together).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.errors import UserError
from gpufleet.plan.ladder import Ladder
from gpufleet.plan.layout import Layout
from gpufleet.plan.search import plan
from gpufleet.plan.types import Candidate, Plan, PlanRequest


@dataclass(frozen=True)
class GroupDemand:
    """One group to plan: its request (model, GPU, traffic, SLOs) and replica bounds."""

    name: str
    request: PlanRequest
    min_replicas: int = 0
    max_replicas: int = 8
    stated_layout: tuple[int, int] | None = None  # (tp, pp) the group's config sets
    stated_where: str = "replicas"  # the config field that states it, for errors


@dataclass(frozen=True)
class GroupPlan:
    name: str
    plan: Plan
    needed_replicas: int  # what its traffic needs at the chosen layout
    replicas: int  # needed_replicas within [min_replicas, max_replicas]
    max_replicas: int
    stated: Candidate | None = None  # the config's own layout, costed, when it states one

    @property
    def chosen(self) -> Candidate:
        """The layout `up` will run: the config's when it states one, else the plan's."""
        return self.stated if self.stated is not None else self.plan.chosen

    @property
    def gpus_per_replica(self) -> int:
        return self.chosen.layout.num_gpus

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def peak_gpus(self) -> int:
        return self.max_replicas * self.gpus_per_replica

    @property
    def notes(self) -> tuple[str, ...]:
        notes = []
        best = self.plan.chosen.layout
        if self.stated is not None and self.stated.layout != best:
            notes.append(
                f"layout {self.stated.layout.label} from the config; the plan would choose "
                f"{self.plan.chosen.replicas or 1} × {best.label}"
            )
        if self.stated is not None and not _meets_slos(self.stated):
            notes.append(f"{self.stated.layout.label} misses the group's SLOs at any load")
        if self.needed_replicas > self.max_replicas:
            notes.append(
                f"--rps needs {self.needed_replicas} replicas; max_replicas "
                f"{self.max_replicas} caps it (raise max_replicas or expect queueing)"
            )
        return tuple(notes)

    def to_dict(self) -> dict[str, Any]:
        req, chosen = self.plan.request, self.chosen
        return {
            "name": self.name,
            "model": req.model.name,
            "gpu": req.gpu.name,
            "engine": req.engine,
            "rps": req.rps,
            "layout": chosen.layout.label,
            "layout_from": "config" if self.stated is not None else "plan",
            "gpus_per_replica": self.gpus_per_replica,
            "needed_replicas": self.needed_replicas,
            "replicas": self.replicas,
            "gpus": self.gpus,
            "max_replicas": self.max_replicas,
            "peak_gpus": self.peak_gpus,
            "slo_met": _meets_slos(chosen),
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
    """Plan every group; raises UserError (from `plan`) when a group's model fits nowhere,
    or when the layout a group's config states cannot hold its model."""
    out = []
    for d in demands:
        p = plan(d.request)
        stated = _stated_layout(d, p) if d.stated_layout is not None else None
        chosen = stated if stated is not None else p.chosen
        needed = chosen.replicas or 1
        replicas = min(max(needed, d.min_replicas), d.max_replicas)
        out.append(GroupPlan(d.name, p, needed, replicas, d.max_replicas, stated))
    return GroupsPlan(tuple(out), max_gpus)


def _meets_slos(c: Candidate) -> bool:
    return bool(c.performance and c.performance.slo_met)


def _stated_layout(d: GroupDemand, p: Plan) -> Candidate:
    """The config's (tp, pp) at the precision the plan chose, memory and speed costed."""
    assert d.stated_layout is not None
    tp, pp = d.stated_layout
    ladder = Ladder(d.request)
    best = p.chosen.layout
    c = ladder.evaluate(
        Layout(tp=tp, pp=pp, weight_dtype=best.weight_dtype, kv_dtype=best.kv_dtype)
    )
    if not ladder.useful(c):
        raise UserError(
            f"group {d.name!r}: {d.request.model.name} does not fit TP={tp} PP={pp} on "
            f"{d.request.gpu.name} at {best.weight_dtype} (weights "
            f"{c.memory.weights_bytes / 2**30:.1f} GiB per GPU of "
            f"{c.memory.usable_bytes / 2**30:.1f} usable; KV cache holds "
            f"{c.kv_concurrent_requests} requests)",
            field=f"{d.stated_where}.tp",
            fix=f"use the plan's layout (tp: {best.tp}, pp: {best.pp}) or remove tp/pp "
            "from the group to let the plan choose",
        )
    return ladder.with_performance(c)
