"""Tenants with their pools and limits, and heterogeneous replica groups (two GPU types
with their own layouts) behind one simulated gateway."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.policies import make_policy as make_scaling_policy
from gpufleet.engine import EngineConfig
from gpufleet.fleet_state import TokenBucket
from gpufleet.perf.scaled import ScaledStepTimeModel, scaled
from gpufleet.perf.step_time import LinearStepTimeModel, StepBatch
from gpufleet.routing import make_policy
from gpufleet.sim.config import AutoscaleSpec, ReplicaGroup, SimConfig, TenantSpec
from gpufleet.sim.report import summarize
from gpufleet.sim.simulator import FleetSimulator, SimResult
from gpufleet.sim.tenants import SimTenants
from gpufleet.workload import KIND_UNIQUE, SimRequest, segment_key

FAST = LinearStepTimeModel(base_s=0.01, per_token_s=1e-5)
SLOW = scaled(FAST, 3.0)
ENGINE = EngineConfig(num_gpu_blocks=4096, block_size=16, max_num_seqs=64,
                      max_num_batched_tokens=4096, max_model_len=8192)  # fmt: skip


def requests(n: int, rate: float, input_tokens: int = 200, out: int = 50) -> list[SimRequest]:
    return [
        SimRequest(i, i / rate, ((segment_key(KIND_UNIQUE, i), input_tokens),), out)
        for i in range(n)
    ]


def run(
    reqs: Sequence[SimRequest],
    groups: Sequence[ReplicaGroup],
    tenants: Sequence[TenantSpec] = (),
    policy: str = "least_outstanding",
    **kw: object,
) -> SimResult:
    cfg = SimConfig(engine=ENGINE, step_time_model=FAST, groups=tuple(groups),
                    tenants=tuple(tenants), **kw)  # type: ignore[arg-type]  # fmt: skip
    return FleetSimulator(cfg, reqs, make_policy(policy, seed=0)).run()


def test_time_scale_slows_every_step_by_its_factor() -> None:
    batch = StepBatch(prefill_tokens=(100,), prefill_context_tokens=(0,), num_decode=3)
    assert SLOW.step_time_s(batch) == pytest.approx(3 * FAST.step_time_s(batch))
    assert scaled(FAST, 1.0) is FAST
    with pytest.raises(ValueError, match="time scale"):
        ScaledStepTimeModel(FAST, 0.0)


def test_a_tenant_pinned_to_a_pool_reaches_only_its_replicas() -> None:
    groups = [ReplicaGroup("shared", ENGINE, FAST, 2), ReplicaGroup("gold", ENGINE, FAST, 2,
                                                                     pool="gold")]  # fmt: skip
    tenants = [TenantSpec("acme", 1.0, pool="gold"), TenantSpec("free", 3.0)]
    result = run(requests(400, 40.0), groups, tenants)
    gold = {"r2", "r3"}  # the second group's replicas
    seen = {(r.tenant, r.replica_id in gold) for r in result.requests}
    assert seen == {("acme", True), ("free", False)}
    counts = Counter(r.tenant for r in result.requests)
    assert 70 < counts["acme"] < 130  # a quarter of 400, drawn
    s = summarize(result)
    assert set(s["tenants"]) == {"acme", "free"} and s["failed"] == 0
    assert s["tenants"]["acme"]["ttft_ms"]["p90"] > 0


def test_a_tenants_rate_limit_answers_429_as_its_token_bucket_says() -> None:
    reqs = requests(200, 20.0)  # 10 s at 20 req/s
    tenants = [TenantSpec("t", 1.0, requests_per_s=2.0, burst=4)]
    result = run(reqs, [ReplicaGroup("g", ENGINE, FAST, 2)], tenants)
    bucket = TokenBucket(2.0, 4)
    expected = [bucket.take(r.arrival_s) == 0.0 for r in reqs]
    assert [r.error is None for r in result.requests] == expected
    assert {r.error for r in result.requests if r.error} == {"rate_limited"}
    assert 20 <= sum(expected) <= 26  # 4 + 2/s over ~10 s


def test_a_tenants_concurrency_cap_holds_at_every_instant() -> None:
    tenants = [TenantSpec("capped", 1.0, max_concurrency=3), TenantSpec("open", 1.0)]
    result = run(requests(300, 60.0, out=200), [ReplicaGroup("g", ENGINE, FAST, 2)], tenants)
    capped = [r for r in result.requests if r.tenant == "capped"]
    assert any(r.error == "rate_limited" for r in capped)
    spans = [(r.arrival_s, r.finished_s) for r in capped if r.ok]
    for t, _ in spans:  # in flight at each admission, itself included
        assert sum(1 for a, b in spans if a <= t < (b or a)) <= 3
    assert all(r.ok for r in result.requests if r.tenant == "open")


def test_a_tenant_routes_with_its_own_policy_and_a_session_keeps_its_tenant() -> None:
    rr = make_policy("round_robin", seed=0)
    reqs = [
        SimRequest(i, i * 0.1, ((segment_key(KIND_UNIQUE, i), 100),), 10,
                   session_key=f"s{i // 3}", after=i - 1 if i % 3 else None)
        for i in range(60)
    ]  # fmt: skip
    specs = [TenantSpec("a", 1.0, routing=rr), TenantSpec("b", 1.0)]
    fleet_policy = make_policy("least_outstanding", seed=0)
    tenants = SimTenants(specs, reqs, fleet_policy, seed=3)
    assert tenants.policies() == {"a": rr}
    for r in reqs:
        if r.after is not None:
            assert tenants.of(r.index) is tenants.of(r.after)
    result = run(reqs, [ReplicaGroup("g", ENGINE, FAST, 3)], specs)
    assert all(r.ok for r in result.requests)


def test_heterogeneous_groups_share_the_load_by_speed_and_cost_by_their_gpus() -> None:
    groups = [
        ReplicaGroup("h100", ENGINE, FAST, 2, gpus_per_replica=1, price_per_gpu_hour_usd=4.0),
        ReplicaGroup("a100", ENGINE, SLOW, 2, gpus_per_replica=2, price_per_gpu_hour_usd=1.5),
    ]
    result = run(requests(600, 60.0, out=100), groups)
    s = summarize(result)
    g = s["groups"]
    assert g["h100"]["requests"] > 1.3 * g["a100"]["requests"]  # the fast ones take more
    assert g["h100"]["requests"] + g["a100"]["requests"] == 600
    span = result.end_s
    assert g["a100"]["gpu_hours"] == pytest.approx(2 * 2 * span / 3600)
    assert s["cost_usd"] == pytest.approx((2 * 1 * 4.0 + 2 * 2 * 1.5) * span / 3600)


def test_a_request_too_long_for_one_layout_fails_there_only() -> None:
    short = EngineConfig(num_gpu_blocks=4096, block_size=16, max_num_seqs=64,
                         max_num_batched_tokens=4096, max_model_len=1024)  # fmt: skip
    groups = [ReplicaGroup("long", ENGINE, FAST, 1), ReplicaGroup("short", short, FAST, 1)]
    result = run(requests(40, 10.0, input_tokens=2000), groups, policy="round_robin")
    by_group = Counter((r.replica_id, r.error) for r in result.requests)
    assert by_group == {("r0", None): 20, ("r1", "context_length_exceeded"): 20}


def test_the_autoscaler_scales_its_group_and_counts_the_others() -> None:
    policy = make_scaling_policy("queue_depth", ReplicaBounds(2, 6), {"capacity_per_replica": 4})
    groups = [
        ReplicaGroup("fixed", ENGINE, FAST, 2),
        ReplicaGroup("elastic", ENGINE, FAST, 0, autoscaled=True, startup_s=2.0),
    ]
    spec = AutoscaleSpec(policy, interval_s=0.5, startup_s=2.0, drain_deadline_s=30.0)
    result = run(requests(600, 60.0, out=300), groups, autoscale=spec)
    elastic = {r.replica_id for r in result.replicas if r.group == "elastic"}
    assert elastic and result.scaling_changes
    fixed = [r for r in result.replicas if r.group == "fixed"]
    assert all(r.stopped_s is None for r in fixed)  # never drained: not the actuator's
    assert max(total for _, _, total in result.fleet_size) <= 6


def test_config_checks_name_what_does_not_fit() -> None:
    g = ReplicaGroup("g", ENGINE, FAST, 1)
    with pytest.raises(ValueError, match="exactly one autoscaled"):
        run([], [g], autoscale=AutoscaleSpec(make_scaling_policy("hpa", ReplicaBounds())))
    with pytest.raises(ValueError, match="names must differ"):
        run([], [g, g])
    with pytest.raises(ValueError, match="shares"):
        run([], [g], [TenantSpec("t", 0.0)])
