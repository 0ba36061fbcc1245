"""The fleet simulator: determinism, conservation, routing and autoscaling behaviour, the
live system's own objects, and agreement with a bare engine and the planner's model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gpufleet.autoscale import controller, gateway_link
from gpufleet.autoscale.decision import ReplicaBounds, ScalingDecision
from gpufleet.autoscale.policies import DefaultPolicy
from gpufleet.autoscale.policies import make_policy as make_scaling_policy
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.engine import Engine, EngineConfig, EngineDriver, EngineRequest
from gpufleet.fleet_state import FleetReplica, FleetState
from gpufleet.native import is_compiled
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.plan.perf_serving import SchedulerShape, predict_closed_loop
from gpufleet.routing import make_policy
from gpufleet.routing.prefix_aware import PrefixAware
from gpufleet.routing.types import ReplicaView, RequestInfo
from gpufleet.sim import fleet as sim_fleet_module
from gpufleet.sim.report import summarize
from gpufleet.sim.scenario import Scenario, build_config, build_requests, run_scenario
from gpufleet.sim.simulator import AutoscaleSpec, FleetSimulator, SimConfig, SimResult
from gpufleet.workload import SegmentHasher, SimRequest, parse_rate_steps

# A made-up linear step time keeps these tests about the driver, not the roofline model.
STEP = LinearStepTimeModel(base_s=0.004, per_token_s=2e-5, per_context_token_s=1e-7)


def config(**kw: object) -> SimConfig:
    engine = kw.pop("engine", None) or EngineConfig(
        num_gpu_blocks=4096, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048,
        max_model_len=4096,
    )  # fmt: skip
    return SimConfig(engine=engine, step_time_model=STEP, **kw)  # type: ignore[arg-type]


def synthetic_requests(**kw: Any) -> list[SimRequest]:
    """The requests of a synthetic scenario, as `gpufleet sim` builds them."""
    return build_requests(Scenario(**kw))


def run(cfg: SimConfig, reqs: Sequence[SimRequest], policy: str = "round_robin") -> SimResult:
    return FleetSimulator(cfg, reqs, make_policy(policy, seed=cfg.seed)).run()


def timeline(result: SimResult) -> list[tuple[object, ...]]:
    return [
        (r.index, r.replica_id, r.first_token_s, r.finished_s, r.output_tokens, r.error)
        for r in result.requests
    ]


def test_same_seed_same_run_and_another_seed_differs() -> None:
    def once(seed: int) -> SimResult:
        reqs = synthetic_requests(
            num_requests=150, rate=30.0, input_tokens=300, output_tokens=40, range_ratio=0.5,
            prefix_groups=6, prefix_tokens=256, seed=seed,
        )  # fmt: skip
        return run(config(replicas=3, seed=seed), reqs, "prefix_aware")

    a, b, c = once(1), once(1), once(2)
    assert timeline(a) == timeline(b)
    assert summarize(a)["prefix_cache_hits_tokens"] == summarize(b)["prefix_cache_hits_tokens"]
    assert timeline(a) != timeline(c)


def test_every_request_completes_or_is_counted_as_failed() -> None:
    # Small KV (preemptions), prompts too long for max_model_len (400s), and an autoscaled
    # fleet that starts empty with a cold start longer than the gateway's queue timeout.
    engine = EngineConfig(
        num_gpu_blocks=96, block_size=16, max_num_seqs=32, max_num_batched_tokens=512,
        max_model_len=1024,
    )  # fmt: skip
    reqs = synthetic_requests(
        num_requests=120, rate=20.0, input_tokens=400, output_tokens=200, range_ratio=0.9, seed=5
    )
    policy = make_scaling_policy("queue_depth", ReplicaBounds(0, 3))
    cfg = config(
        engine=engine, replicas=0, queue_timeout_s=2.0,
        autoscale=AutoscaleSpec(policy, interval_s=0.5, startup_s=3.0, drain_deadline_s=5.0),
    )  # fmt: skip
    result = run(cfg, reqs)
    s = summarize(result)
    assert [r.index for r in result.requests] == list(range(len(reqs)))
    assert s["completed"] + s["failed"] == len(reqs)
    assert s["failures"].get("queue_timeout", 0) > 0
    assert s["failures"].get("context_length_exceeded", 0) > 0
    assert s["preemptions"] > 0
    for r, req in zip(result.requests, reqs, strict=True):
        if r.ok:
            assert r.output_tokens == req.output_tokens
            assert r.first_token_s is not None and r.finished_s is not None
            assert r.arrival_s <= r.first_token_s <= r.finished_s
        else:
            assert r.error in ("queue_timeout", "context_length_exceeded", "drain_deadline")
            assert r.output_tokens == 0 or r.error == "drain_deadline"
    # Nothing is left in any engine once the run ends.
    assert sum(rec.requests for rec in result.replicas) == sum(
        1 for r in result.requests if r.dispatched_s is not None
    )


def test_prefix_aware_hits_the_cache_more_than_round_robin() -> None:
    reqs = synthetic_requests(
        num_requests=250, rate=40.0, input_tokens=64, output_tokens=16, prefix_groups=25,
        prefix_tokens=1024, seed=7,
    )  # fmt: skip
    engine = EngineConfig(
        num_gpu_blocks=1200, block_size=16, max_num_seqs=64, max_num_batched_tokens=4096,
        max_model_len=4096,
    )  # fmt: skip
    hit = {
        name: summarize(run(config(engine=engine, replicas=4), reqs, name))["prefix_cache_hit_rate"]
        for name in ("round_robin", "prefix_aware")
    }
    assert hit["prefix_aware"] > hit["round_robin"] + 0.1, hit


def test_autoscaled_step_load_scales_out_then_back_in() -> None:
    sc = Scenario(
        rate_steps=parse_rate_steps("1:60,25:60,0.5:150"), input_tokens=1500,
        output_tokens=150, autoscale="default", min_replicas=1, max_replicas=5, replicas=1,
        startup_s=10.0, seed=3,
    )  # fmt: skip
    s = run_scenario(sc)
    ups = [c for c in s["scaling_changes"] if c["to"] > c["from"]]
    downs = [c for c in s["scaling_changes"] if c["to"] < c["from"]]
    assert ups and downs, s["scaling_changes"]
    assert min(c["t_s"] for c in ups) < min(c["t_s"] for c in downs)
    assert s["peak_ready_replicas"] >= 2
    assert all(c["reason"] for c in s["scaling_changes"])
    assert s["failed"] == 0
    # Scale-in happens in the quiet tail, not under the burst.
    assert all(c["t_s"] > 120.0 for c in downs)


@pytest.mark.skipif(is_compiled(sim_fleet_module), reason="spies on a compiled policy's choose")
def test_runs_the_live_systems_own_objects() -> None:
    reqs = synthetic_requests(
        num_requests=30, rate=10.0, input_tokens=200, output_tokens=10, prefix_groups=3,
        prefix_tokens=128,
    )  # fmt: skip
    routing = make_policy("prefix_aware", seed=0)
    scaling = make_scaling_policy("default", ReplicaBounds(2, 2))
    seen: list[tuple[RequestInfo, tuple[ReplicaView, ...]]] = []
    choose = routing.choose

    def spy(info: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        seen.append((info, tuple(replicas)))
        return choose(info, replicas)

    routing.choose = spy  # type: ignore[method-assign]
    cfg = config(replicas=2, autoscale=AutoscaleSpec(scaling, startup_s=0.0))
    sim = FleetSimulator(cfg, reqs, routing)
    sim.run()
    assert type(routing) is PrefixAware and isinstance(scaling, DefaultPolicy)
    assert sim.routing is routing and cfg.autoscale is not None and cfg.autoscale.policy is scaling
    assert sim_fleet_module.fleet_signals is gateway_link.fleet_signals
    assert sim_fleet_module.scale_in_order is controller.scale_in_order
    assert controller.Controller._scale_in_order.__code__.co_names.count("scale_in_order") == 1
    # The gateway's bookkeeping is the fleet core the live gateway drives.
    assert type(sim.fleet_state) is FleetState and sim.fleet_state.policy is routing
    signals = sim.gateway_signals()
    assert {r.replica_id for r in signals.replicas} == set(sim.replicas)
    for replica in sim.replicas.values():
        assert type(replica.engine) is Engine
        assert type(replica.view) is FleetReplica
        assert sim.fleet_state.table.by_id[replica.replica_id] is replica.view
    assert len(seen) == len(reqs)
    for info, views in seen:
        assert type(info) is RequestInfo and info.prefix_hashes
        assert {v.replica_id for v in views} <= set(sim.replicas)
        assert all(v is sim.replicas[v.replica_id].view for v in views)
    # After the first scrape the views carry engine stats, as the gateway's do.
    assert all(r.view.stats is not None for r in sim.replicas.values())


def bare_engine_closed_loop(
    cfg: SimConfig, reqs: Sequence[SimRequest], clients: int
) -> dict[int, tuple[float, float]]:
    """One engine, `clients` closed-loop clients, driven as the replica runner drives it
    (the engine-driver contract): the next step begins at a step's end before any reply
    can come back."""
    engine = Engine(cfg.engine, cfg.step_time_model, seed=0)
    driver = EngineDriver(engine)
    hasher = SegmentHasher(cfg.engine.block_size)
    pending = list(reqs)
    out: dict[int, tuple[float, float]] = {}
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}

    def add(t: float) -> None:
        req = pending.pop(0)
        rid = f"sim-{req.index}"
        arrival[rid] = t
        driver.submit(EngineRequest(
            rid, [0] * req.input_tokens, req.output_tokens, seed=cfg.seed * 1_000_003 + req.index,
            prompt_block_hashes=hasher.hashes(req.segments), arrival_s=t,
        ), t)  # fmt: skip

    for _ in range(clients):
        add(0.0)
    outcome = driver.begin()
    while outcome is not None:
        t = outcome.now_s
        for r in outcome.emitted:
            first.setdefault(r.request_id, t)
        replies = len(outcome.finished)
        for r in outcome.finished:
            out[int(r.request_id[4:])] = (first[r.request_id] - arrival[r.request_id],
                                          t - arrival[r.request_id])  # fmt: skip
        outcome = driver.begin()  # the runner starts the next step at once...
        for _ in range(min(replies, len(pending))):
            add(t)  # ...and the clients' next requests arrive after it started
        if outcome is None and engine.has_work:
            outcome = driver.begin()
    return out


@pytest.mark.parametrize("clients", [1, 6])
def test_one_replica_agrees_with_a_bare_engine_and_the_planner(clients: int) -> None:
    sc = Scenario(
        concurrency=clients, num_requests=clients * 10, input_tokens=1024, output_tokens=96,
        replicas=1,
    )  # fmt: skip
    cfg = build_config(sc)
    reqs = build_requests(sc)
    result = FleetSimulator(cfg, reqs, make_policy("round_robin", seed=0)).run()
    bare = bare_engine_closed_loop(cfg, reqs, clients)
    assert len(bare) == len(reqs)
    for r in result.requests:
        ttft, e2e = bare[r.index]
        assert r.ttft_s == pytest.approx(ttft, abs=1e-9)
        assert r.e2e_s == pytest.approx(e2e, abs=1e-9)
    # And with the planner's closed-loop model for the same engine: TPOT and throughput
    # agree within 15 % (TTFT too for one client; with several, synchronized clients
    # queue their prefills together, which the model's mean-value queue averages out).
    s = summarize(result)
    pred = predict_closed_loop(
        cfg.step_time_model, 1024, 96, clients,
        SchedulerShape(cfg.engine.max_num_batched_tokens, cfg.engine.max_num_seqs, True),
        requests_per_client=10,
    )  # fmt: skip
    assert s["tpot_ms"]["mean"] == pytest.approx(pred.tpot_s * 1000, rel=0.15)
    assert s["request_throughput"] == pytest.approx(pred.requests_per_s, rel=0.15)
    if clients == 1:
        assert s["ttft_ms"]["mean"] == pytest.approx(pred.ttft_s * 1000, rel=0.2)


@pytest.mark.process
def test_sweep_over_autoscaling_policies_in_processes() -> None:
    from gpufleet.sim.scenario import run_many

    base = Scenario(
        rate_steps=parse_rate_steps("1:20,12:30,0.5:60"), input_tokens=800,
        output_tokens=80, min_replicas=1, max_replicas=4, startup_s=5.0, seed=2,
    )  # fmt: skip
    names = ["default", "hpa", "queue_depth"]
    runs = run_many([base.with_field("autoscale", n).with_field("name", n) for n in names], 2)
    assert [r["scenario"] for r in runs] == names
    for r in runs:
        assert r["completed"] + r["failed"] == r["requests"] > 0
        assert r["scaling_decisions"] > 0 and r["replica_seconds"] > 0
        assert r["fleet_timeline"][0][1] == 1  # starts from min_replicas ready
    # The same scenario run here, in this process, gives the same figures.
    again = run_scenario(base.with_field("autoscale", "hpa").with_field("name", "hpa"))
    assert again["ttft_ms"] == runs[1]["ttft_ms"]
    assert again["scaling_changes"] == runs[1]["scaling_changes"]


def test_sessions_send_each_turn_after_the_last_and_affinity_keeps_their_cache() -> None:
    reqs = synthetic_requests(
        sessions=40, turns=4, rate=4.0, input_tokens=200, output_tokens=50, seed=9
    )
    assert len(reqs) == 160 and reqs[1].after == 0 and reqs[1].session_key == "session-0"
    engine = EngineConfig(
        num_gpu_blocks=800, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048,
        max_model_len=4096,
    )  # fmt: skip
    results = {
        name: run(config(engine=engine, replicas=4), reqs, name)
        for name in ("round_robin", "session")
    }
    for result in results.values():
        by_index = {r.index: r for r in result.requests}
        for req in reqs:
            if req.after is not None:  # sent only once the previous turn had ended
                prev = by_index[req.after]
                assert prev.finished_s is not None
                assert by_index[req.index].arrival_s == prev.finished_s
    hit = {n: summarize(r)["prefix_cache_hit_rate"] for n, r in results.items()}
    assert hit["session"] > hit["round_robin"] + 0.1, hit
    # One replica with room for everything: each turn finds the whole previous turn (its
    # prompt and the answer the engine generated) in the cache, to the last full block.
    one = summarize(run(config(replicas=1), reqs))
    by_index = {r.index: r for r in reqs}
    reusable = sum(
        (by_index[r.after].input_tokens + by_index[r.after].output_tokens) // 16 * 16
        for r in reqs
        if r.after is not None
    )
    assert one["prefix_cache_hits_tokens"] == reusable


def test_a_failed_turn_ends_its_session_and_the_rest_is_counted() -> None:
    engine = EngineConfig(
        num_gpu_blocks=400, block_size=16, max_num_seqs=16, max_num_batched_tokens=1024,
        max_model_len=800,
    )  # fmt: skip
    reqs = synthetic_requests(
        sessions=10, turns=5, rate=2.0, input_tokens=150, output_tokens=60, seed=1
    )
    cfg = config(engine=engine, replicas=2)
    sim = FleetSimulator(cfg, reqs, make_policy("round_robin", seed=cfg.seed))
    s = summarize(sim.run())
    # Turn 4 (3 x 210 + 150 + 60 tokens) is past max_model_len: refused; turn 5 not sent.
    assert s["failures"] == {"context_length_exceeded": 10, "previous_turn_failed": 10}
    assert s["completed"] == 30 and s["requests"] == 50
    # Nothing of a session is held once it ended: not the tokens turn 3 left for the
    # refused turn 4 to resend, nor who follows whom.
    assert sim.clients._turn_tokens == {} and sim.clients._followers == {}


class ScriptedScaling:
    """A scaling policy that follows a fixed schedule (a test input, so the driver's
    drain path is exercised at known times)."""

    name = "scripted"

    def __init__(self, schedule: list[tuple[float, int]]) -> None:
        self.schedule = schedule

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision:
        desired = next(n for t, n in reversed(self.schedule) if now_s >= t)
        return ScalingDecision(desired, f"scripted: {desired}", self.name, now_s,
                               signals.current_replicas)  # fmt: skip


def test_scale_in_drains_then_cuts_at_the_deadline() -> None:
    reqs = synthetic_requests(num_requests=60, rate=10.0, input_tokens=100, output_tokens=400)
    spec = AutoscaleSpec(ScriptedScaling([(0.0, 3), (3.0, 1)]), startup_s=0.0,
                         drain_deadline_s=1.0)  # fmt: skip
    cfg = config(replicas=3, autoscale=spec, engine=EngineConfig(
        num_gpu_blocks=4096, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048,
        max_model_len=4096,
    ))  # fmt: skip
    result = run(cfg, reqs, "least_outstanding")
    s = summarize(result)
    assert s["completed"] + s["failed"] == len(reqs)
    assert s["failures"].get("drain_deadline", 0) > 0
    stopped = [r for r in result.replicas if r.stopped_s is not None]
    assert len(stopped) == 2 and all(3.0 <= r.stopped_s <= 4.0 + 1e-9 for r in stopped)
    by_replica = {r.replica_id: r for r in result.replicas}
    for r in result.requests:
        if r.dispatched_s is not None and r.dispatched_s > 3.0:
            assert by_replica[r.replica_id or ""].stopped_s is None  # none sent to a drainer
    assert [c.desired_replicas for c in result.scaling_changes] == [1]


def test_a_replica_drained_before_its_deadline_does_not_stretch_the_run() -> None:
    # Scaled in with room to drain: the replicas stop long before their 600 s deadline,
    # and the run (to which every replica alive is charged) ends with its last request.
    reqs = synthetic_requests(num_requests=40, rate=10.0, input_tokens=100, output_tokens=20)
    spec = AutoscaleSpec(ScriptedScaling([(0.0, 3), (1.0, 1)]), startup_s=0.0,
                         drain_deadline_s=600.0)  # fmt: skip
    result = run(config(replicas=3, autoscale=spec), reqs, "least_outstanding")
    last_s = max(r.finished_s or 0.0 for r in result.requests)
    assert all(r.error is None for r in result.requests)
    assert sum(1 for r in result.replicas if r.stopped_s is not None) == 2
    assert result.end_s < last_s + 5.0, (result.end_s, last_s)


def queued_for_a_cold_start(
    num_requests: int, queue_max_size: int, queue_timeout_s: float
) -> SimResult:
    """A burst at an empty fleet: the gateway queues it while `queue_depth` starts one
    replica (2 s cold start)."""
    reqs = synthetic_requests(num_requests=num_requests, rate=1000.0, input_tokens=100,
                              output_tokens=8, seed=1)  # fmt: skip
    policy = make_scaling_policy("queue_depth", ReplicaBounds(0, 1))
    cfg = config(
        replicas=0, queue_max_size=queue_max_size, queue_timeout_s=queue_timeout_s,
        autoscale=AutoscaleSpec(policy, interval_s=1.0, startup_s=2.0),
    )  # fmt: skip
    return run(cfg, reqs)


def test_a_queued_request_routed_before_its_deadline_does_not_stretch_the_run() -> None:
    # Queued for a cold start and routed long before their 600 s queue deadline: the stale
    # timeouts must not set the clock (and so `end_s`, to which every replica is charged).
    result = queued_for_a_cold_start(num_requests=5, queue_max_size=10, queue_timeout_s=600.0)
    assert all(r.ok for r in result.requests)
    last_s = max(r.finished_s or 0.0 for r in result.requests)
    assert result.end_s < last_s + 60.0, (result.end_s, last_s)


def test_a_full_gateway_queue_answers_503_as_the_live_gateway_does() -> None:
    """The gateway's queue is bounded (`queue.max_size`): beyond it a request gets a 503 at
    once. The simulator used to queue without a bound and never answered it."""
    result = queued_for_a_cold_start(num_requests=20, queue_max_size=5, queue_timeout_s=30.0)
    errors = [r.error for r in result.requests]
    assert errors.count("queue_full") == 15
    assert all(r.dispatched_s is None for r in result.requests if r.error == "queue_full")
    # The five that found room waited for the cold start and then completed.
    waited = [r for r in result.requests if r.ok]
    assert len(waited) == 5
    assert all(r.dispatched_s is not None and r.dispatched_s >= 2.0 for r in waited)
    assert summarize(result)["failures"] == {"queue_full": 15}
