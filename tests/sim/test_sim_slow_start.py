"""Slow start in the simulator: a replica that joins a loaded fleet is not herded onto."""

from __future__ import annotations

import pytest

from gpufleet.engine import EngineConfig
from gpufleet.errors import UserError
from gpufleet.routing import make_policy
from gpufleet.sim.scenario import Scenario, build_config
from gpufleet.sim.simulator import AutoscaleSpec, FleetSimulator

from .test_simulator import ScriptedScaling, config, synthetic_requests


def _joining_replica_first_second(slow_start_s: float) -> tuple[int, int, float]:
    """Three replicas under load, a fourth ready at t = 6 s: of the requests arriving in
    its first second, (how many, how many it took, their largest TTFT). Routed by plain
    request counts (prefill weight 1, not the default 4): slow start alone against the herd."""
    reqs = synthetic_requests(num_requests=900, rate=60.0, input_tokens=1500,
                              output_tokens=300, seed=0)  # fmt: skip
    spec = AutoscaleSpec(ScriptedScaling([(0.0, 3), (4.0, 4)]), startup_s=2.0,
                         drain_deadline_s=30.0)  # fmt: skip
    engine = EngineConfig(num_gpu_blocks=40000, block_size=16, max_num_seqs=256,
                          max_num_batched_tokens=2048, max_model_len=4096)  # fmt: skip
    cfg = config(replicas=3, autoscale=spec, slow_start_s=slow_start_s, engine=engine)
    policy = make_policy("least_outstanding", seed=cfg.seed, prefill_weight=1.0)
    result = FleetSimulator(cfg, reqs, policy).run()
    ready_s = min(r.arrival_s for r in result.requests if r.replica_id == "r3")
    window = [r for r in result.requests if ready_s <= r.arrival_s < ready_s + 1.0]
    ttfts = [r.ttft_s for r in window if r.ttft_s is not None]
    assert len(ttfts) == len(window)
    return len(window), sum(r.replica_id == "r3" for r in window), max(ttfts)


def test_slow_start_spreads_a_joining_replicas_first_second_and_cuts_its_ttft_tail() -> None:
    n_off, new_off, worst_off = _joining_replica_first_second(0.0)
    n_on, new_on, worst_on = _joining_replica_first_second(10.0)
    assert n_off == n_on
    assert new_off == n_off  # off: the herd, every arrival goes to the new replica
    assert new_on < n_on / 2  # on: a ramped share
    assert worst_on < worst_off / 2


def test_a_negative_slow_start_is_a_user_error_naming_the_flag() -> None:
    with pytest.raises(UserError) as e:
        build_config(Scenario(num_requests=1, rate=1.0, slow_start_s=-1.0))
    assert e.value.field == "--slow-start-s"
    assert build_config(Scenario(num_requests=1, rate=1.0)).slow_start_s == 0.0
