"""A scenario's fleet beyond one layout, built for `SimConfig`: its replica groups (each a
layout from the planner's replica profile), its tenants and the failures it meets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.engine import EngineConfig
from gpufleet.errors import UserError
from gpufleet.perf.scaled import scaled
from gpufleet.plan.profile import replica_profile
from gpufleet.routing import make_policy as make_routing_policy
from gpufleet.sim.config import FaultSpec, ReplicaGroup, TenantSpec
from gpufleet.sim.fleet_spec import GroupSpec
from gpufleet.specs.gpus import load_gpu

if TYPE_CHECKING:
    from gpufleet.sim.scenario import Scenario


def build_groups(sc: Scenario) -> tuple[ReplicaGroup, ...]:
    """The groups of `--config`, each layout key it leaves out taken from the flags; else
    one group of the flags' layout (`--replicas`, autoscaled with `--autoscale`)."""
    specs = sc.fleet.groups if sc.fleet is not None else ()
    if not specs:
        initial = sc.replicas
        if sc.autoscale:
            initial = max(sc.min_replicas, min(sc.max_replicas, sc.replicas))
        one = GroupSpec(name="default", replicas=initial, autoscale=bool(sc.autoscale))
        return (_group(sc, one, ""),)
    if sc.autoscale and not any(g.autoscale for g in specs):
        raise UserError("--autoscale needs a group to scale", field="groups[].autoscale",
                        fix="mark one group autoscale: true")  # fmt: skip
    if not sc.autoscale and any(g.autoscale for g in specs):
        raise UserError("a group is autoscaled but no policy is given", field="--autoscale",
                        fix="pass --autoscale POLICY, or drop autoscale: true")  # fmt: skip
    if not sc.autoscale and sum(g.replicas for g in specs) < 1:
        raise UserError("a fixed fleet needs a replica", field="groups[].replicas")
    return tuple(_group(sc, g, f"groups.{i}.") for i, g in enumerate(specs))


def _group(sc: Scenario, g: GroupSpec, where: str) -> ReplicaGroup:
    def pick(key: str) -> object:
        value = getattr(g, key)
        return getattr(sc, key) if value is None else value

    gpu, tp, pp = str(pick("gpu")), int(str(pick("tp"))), int(str(pick("pp")))
    try:
        profile = replica_profile(
            sc.model, gpu, tp=tp, pp=pp, ep=int(str(pick("ep"))), quant=str(pick("quant")),
            kv_dtype=str(pick("kv_cache_dtype")),
            max_model_len=g.max_model_len if g.max_model_len is not None else sc.max_model_len,
            gpu_memory_utilization=float(str(pick("gpu_memory_utilization"))),
            max_num_seqs=int(str(pick("max_num_seqs"))),
            max_num_batched_tokens=(g.max_num_batched_tokens
                                    if g.max_num_batched_tokens is not None
                                    else sc.max_num_batched_tokens),
        )  # fmt: skip
    except UserError as exc:  # say which group the layout came from
        if not where:
            raise
        field = where + (exc.field or "layout").lstrip("-")
        raise UserError(exc.message, field=field, fix=exc.fix) from None
    engine = EngineConfig.of_replica(profile, enable_prefix_caching=sc.enable_prefix_caching)
    price = g.gpu_price if g.gpu_price is not None else sc.gpu_price
    return ReplicaGroup(
        g.name,
        engine,
        scaled(profile.step_time_model, sc.time_scale),
        g.replicas,
        pool=g.pool,
        autoscaled=g.autoscale,
        startup_s=g.startup_s if g.startup_s is not None else sc.startup_s,
        gpus_per_replica=tp * pp,
        price_per_gpu_hour_usd=price if price is not None else load_gpu(gpu).price_per_gpu_hour_usd,
    )


def build_tenants(sc: Scenario) -> tuple[TenantSpec, ...]:
    tenants = sc.fleet.tenants if sc.fleet is not None else ()
    out = []
    for i, t in enumerate(tenants):
        routing = None
        if t.policy is not None:
            options = t.policy_options or {}
            try:
                routing = make_routing_policy(t.policy, seed=sc.seed, **options)
            except UserError as exc:
                raise UserError(exc.message, field=f"tenants.{i}.policy", fix=exc.fix) from None
        out.append(TenantSpec(t.name, t.share, t.pool, routing, t.requests_per_s, t.burst,
                              t.max_concurrency))  # fmt: skip
    return tuple(out)


def build_faults(sc: Scenario) -> FaultSpec | None:
    """`--mtbf-s` (with `--restart-crashed/--no-restart-crashed`), else `failures:`."""
    if sc.mtbf_s is not None:
        if not sc.mtbf_s > 0:
            raise UserError("must be > 0", field="--mtbf-s", fix="e.g. 3600 (an hour)")
        return FaultSpec(sc.mtbf_s, sc.restart_crashed)
    failures = sc.fleet.failures if sc.fleet is not None else None
    return FaultSpec(failures.mtbf_s, failures.restart) if failures is not None else None
