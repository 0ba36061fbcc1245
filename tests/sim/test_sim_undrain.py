"""A scale-out while replicas drain takes them back (warm, at once) before it cold-starts
new ones, in the simulator as in the live actuator."""

from __future__ import annotations

import pytest

from gpufleet.autoscale.controller import undrain_order
from gpufleet.autoscale.signals import FleetSignals, ReplicaSignals
from gpufleet.engine import EngineConfig
from gpufleet.native import is_compiled
from gpufleet.routing.types import ReplicaState
from gpufleet.sim import fleet as sim_fleet
from gpufleet.sim.fleet import SimFleet
from gpufleet.sim.report import summarize
from gpufleet.sim.simulator import AutoscaleSpec, SimResult

from .test_simulator import ScriptedScaling, config, run, synthetic_requests

COLD_START_S = 30.0


def scale_in_then_out(requests: int = 80) -> SimResult:
    """3 replicas, scaled in to 1 at t = 2 s and back out to 3 at t = 4 s, with long
    requests still running on the drained ones (a 600 s drain deadline)."""
    reqs = synthetic_requests(num_requests=requests, rate=10.0, input_tokens=100,
                              output_tokens=1000, seed=3)  # fmt: skip
    spec = AutoscaleSpec(ScriptedScaling([(0.0, 3), (2.0, 1), (4.0, 3)]), interval_s=0.5,
                         startup_s=COLD_START_S, drain_deadline_s=600.0)  # fmt: skip
    cfg = config(replicas=3, autoscale=spec, engine=EngineConfig(
        num_gpu_blocks=4096, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048,
        max_model_len=4096,
    ))  # fmt: skip
    return run(cfg, reqs, "least_outstanding")


def test_a_scale_out_takes_draining_replicas_back_instead_of_cold_starting() -> None:
    result = scale_in_then_out()
    s = summarize(result)
    assert s["undrained"] == 2 and result.undrained == 2
    # No replica was started: the three of t = 0 served the whole run.
    assert len(result.replicas) == 3 and all(r.stopped_s is None for r in result.replicas)
    assert s["completed"] == len(result.requests)
    # The burst after the scale-out went to the returned replicas at once, long before a
    # cold start could have ended.
    returned = {r.replica_id for r in result.replicas} - {"r0"}
    early = [
        r for r in result.requests
        if r.replica_id in returned and r.dispatched_s is not None
        and 4.0 <= r.dispatched_s < 4.0 + COLD_START_S
    ]  # fmt: skip
    assert early


@pytest.mark.skipif(is_compiled(sim_fleet), reason="patches SimFleet, compiled")
def test_taking_back_costs_fewer_gpu_seconds_than_cold_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours = summarize(scale_in_then_out())
    # The old behaviour: a draining replica cannot be taken back, so the scale-out starts
    # two new replicas (charged through their cold start) while the drained ones finish.
    monkeypatch.setattr(SimFleet, "undrain", lambda self, replica: False)
    cold = summarize(scale_in_then_out())
    assert cold["undrained"] == 0 and cold["replicas_used"] == 5
    assert ours["replica_seconds"] < cold["replica_seconds"]
    assert ours["ttft_ms"]["p90"] <= cold["ttft_ms"]["p90"]


def test_a_stale_drain_deadline_neither_cuts_nor_stretches_the_run() -> None:
    # Taken back, the replicas' 600 s drain deadlines are stale: nothing is cut at them,
    # and the run ends with its last request, not at the deadline.
    result = scale_in_then_out()
    assert all(r.error is None for r in result.requests)
    last_s = max(r.finished_s or 0.0 for r in result.requests)
    assert result.end_s < last_s + 60.0, (result.end_s, last_s)


def test_the_draining_replica_with_the_most_requests_goes_back_first() -> None:
    signals = FleetSignals(
        replicas=(
            ReplicaSignals("a", ReplicaState.DRAINING, in_flight=1),
            ReplicaSignals("b", ReplicaState.DRAINING, running=3, waiting=2),
            ReplicaSignals("c", ReplicaState.READY, in_flight=9),
            ReplicaSignals("d", ReplicaState.DRAINING, in_flight=7),
            ReplicaSignals("e", ReplicaState.DRAINING, in_flight=1),
        )
    )
    assert undrain_order(signals, {"a", "b", "c", "d", "e"}) == ["d", "b", "a", "e"]
    assert undrain_order(signals, {"a", "c"}) == ["a"]  # only the actuator's own
