"""Replica failures in the simulator, handled as `gpufleet up`'s gateway and actuator
handle a crashed replica process: retried before the first token, cut after it,
the replica out of the table at once and restarted after its backoff and a cold start."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpufleet.engine import EngineConfig
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.routing import make_policy
from gpufleet.sim import faults as faults_module
from gpufleet.sim.config import FaultSpec, ReplicaGroup, SimConfig
from gpufleet.sim.events import CRASH
from gpufleet.sim.replica import SimReplica
from gpufleet.sim.report import summarize
from gpufleet.sim.simulator import FleetSimulator, SimResult
from gpufleet.workload import KIND_UNIQUE, SimRequest, segment_key

STEP = LinearStepTimeModel(base_s=0.01, per_token_s=1e-5)
ENGINE = EngineConfig(num_gpu_blocks=4096, block_size=16, max_num_seqs=64,
                      max_num_batched_tokens=4096, max_model_len=8192)  # fmt: skip


def requests(times: Sequence[float], output_tokens: int = 100) -> list[SimRequest]:
    return [
        SimRequest(i, t, ((segment_key(KIND_UNIQUE, i), 200),), output_tokens)
        for i, t in enumerate(times)
    ]


def crash_at(monkeypatch: pytest.MonkeyPatch, when: dict[tuple[str, int], float]) -> None:
    """Crash replica (id, restarts) at the given times, and never otherwise."""

    def arm(self: faults_module.SimFaults, replica: SimReplica) -> None:
        at_s = when.get((replica.replica_id, replica.restarts))
        if at_s is not None:
            self.events.push(at_s, CRASH, replica)

    monkeypatch.setattr(faults_module.SimFaults, "arm", arm)


def run(reqs: Sequence[SimRequest], replicas: int, **kw: object) -> SimResult:
    group = ReplicaGroup("g", ENGINE, STEP, replicas, startup_s=5.0, gpus_per_replica=4,
                         price_per_gpu_hour_usd=2.0)  # fmt: skip
    cfg = SimConfig(engine=ENGINE, step_time_model=STEP, groups=(group,),
                    faults=FaultSpec(mtbf_s=1e12), **kw)  # type: ignore[arg-type]  # fmt: skip
    return FleetSimulator(cfg, reqs, make_policy("round_robin")).run()


def test_a_crash_cuts_streams_retries_the_rest_and_restarts_the_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # r0 gets requests 0, 2, 4, ...; at 0.5 s the early ones stream, those sent at 0.49 s
    # have not had their first token yet.
    times = [0.0, 0.0, 0.1, 0.1, 0.49, 0.49, 3.0, 3.0]
    crash_at(monkeypatch, {("r0", 0): 0.5})
    result = run(requests(times), replicas=2)
    by = {r.index: r for r in result.requests}
    assert by[0].error == by[2].error == "stream_cut"  # had streamed on r0
    assert by[0].first_token_s is not None and by[0].finished_s is None
    assert by[4].ok and by[4].attempts == 2 and by[4].replica_id == "r1"  # retried
    assert all(by[i].ok and by[i].attempts == 1 for i in (1, 3, 5, 6, 7))
    assert result.crashes == 1 and result.retries == 1
    # r0 was restarted under its id: 0.5 s backoff and a 5 s cold start; it held its GPUs.
    r0 = [rec for rec in result.replicas if rec.replica_id == "r0"]
    assert [rec.restarts for rec in r0] == [0, 1]
    assert r0[0].stopped_s == 0.5 and r0[1].started_s == 0.5
    assert r0[1].ready_s == pytest.approx(0.5 + 0.5 + 5.0)
    s = summarize(result)
    assert s["failures"] == {"stream_cut": 2} and s["crashes"] == 1
    assert s["gpu_hours"] == pytest.approx(
        sum(rec.lifetime_s for rec in result.replicas) * 4 / 3600
    )
    assert s["cost_usd"] == pytest.approx(s["gpu_hours"] * 2.0)
    assert s["groups"]["g"]["replicas"] == 2 and s["groups"]["g"]["restarts"] == 1


def test_with_one_replica_a_request_before_its_first_token_fails_and_later_ones_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No other replica to try: the proxy's 502. Requests arriving while it restarts wait
    # in the gateway's queue and are served once it is back.
    crash_at(monkeypatch, {("r0", 0): 0.5})
    result = run(requests([0.0, 0.49, 1.0, 2.0]), replicas=1)
    errors = [r.error for r in result.requests]
    assert errors == ["stream_cut", "replica_failed", None, None]
    ready = 0.5 + 0.5 + 5.0
    assert all(r.dispatched_s == pytest.approx(ready) for r in result.requests[2:])


def test_max_attempts_one_means_no_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    crash_at(monkeypatch, {("r0", 0): 0.5})
    result = run(requests([0.49, 0.49]), replicas=2, max_attempts=1)
    assert [r.error for r in result.requests] == ["replica_failed", None]
    assert result.retries == 0


def test_a_crash_while_restarting_restarts_again_with_a_longer_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crash_at(monkeypatch, {("r0", 0): 0.5, ("r0", 1): 2.0})  # the second during its load
    result = run(requests([0.0, 10.0]), replicas=1)
    gens = [rec for rec in result.replicas if rec.replica_id == "r0"]
    assert [g.restarts for g in gens] == [0, 1, 2]
    assert gens[1].ready_s is None and gens[1].stopped_s == 2.0
    assert gens[2].ready_s == pytest.approx(2.0 + 1.0 + 5.0)  # backoff 0.5 s, then 1 s
    assert result.requests[1].ok


def test_failures_come_at_the_mtbf_and_a_seed_fixes_them() -> None:
    group = ReplicaGroup("g", ENGINE, STEP, 4, startup_s=10.0)

    def once(seed: int) -> SimResult:
        cfg = SimConfig(engine=ENGINE, step_time_model=STEP, groups=(group,), seed=seed,
                        faults=FaultSpec(mtbf_s=200.0), tail_s=0.0)  # fmt: skip
        reqs = requests([i * 2.0 for i in range(1000)], output_tokens=20)  # 2000 s
        return FleetSimulator(cfg, reqs, make_policy("least_outstanding", seed=seed)).run()

    a, b, c = once(1), once(1), once(2)
    assert a.crashes == b.crashes and [r.error for r in a.requests] == [r.error for r in b.requests]
    assert [rec.stopped_s for rec in a.replicas] != [rec.stopped_s for rec in c.replicas]
    # 4 replicas x ~2000 s at one failure per 200 s: ~40 (Poisson: 3 sigma ~ 19)
    assert 21 <= a.crashes <= 59
    s = summarize(a)
    assert s["completed"] + s["failed"] == 1000 and s["completed"] > 900
