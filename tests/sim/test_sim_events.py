"""The simulator's event heap: open-loop arrivals are fed to it one at a time, in the
order pushing them all at the start would pop them (time, then request order)."""

from __future__ import annotations

from gpufleet.engine import EngineConfig
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.routing import make_policy
from gpufleet.sim.events import ARRIVAL
from gpufleet.sim.simulator import FleetSimulator, SimConfig
from gpufleet.workload import SimRequest

STEP = LinearStepTimeModel(base_s=0.004, per_token_s=2e-5, per_context_token_s=1e-7)
ENGINE = EngineConfig(num_gpu_blocks=1024, block_size=16, max_num_seqs=16,
                      max_num_batched_tokens=1024, max_model_len=2048)  # fmt: skip


def simulator(arrivals_s: list[float], replicas: int) -> FleetSimulator:
    reqs = [SimRequest(i, t, ((i, 64),), 8) for i, t in enumerate(arrivals_s)]
    cfg = SimConfig(engine=ENGINE, step_time_model=STEP, replicas=replicas)
    return FleetSimulator(cfg, reqs, make_policy("round_robin", seed=0))


def test_the_heap_holds_only_the_next_open_loop_arrival() -> None:
    sim = simulator([0.3, 0.1, 0.2, 0.1], replicas=2)
    sim.clients.start()
    pending = [(t, payload) for t, kind, _, payload in sim.events.heap if kind == ARRIVAL]
    assert pending == [(0.1, 1)]  # the earliest; of two at 0.1, the first in request order


def test_arrivals_are_handled_by_time_then_request_order() -> None:
    # Round robin hands out replicas in the order requests reach the gateway.
    result = simulator([0.5, 0.0, 0.5, 0.0, 0.5], replicas=5).run()
    by_index = {r.index: r.replica_id for r in result.requests}
    assert [by_index[i] for i in (1, 3, 0, 2, 4)] == ["r0", "r1", "r2", "r3", "r4"]
    assert all(r.ok for r in result.requests)
