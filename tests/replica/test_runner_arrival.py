"""The real-time runner starts an idle engine's clock at the request's arrival."""

import asyncio
import time

from gpufleet.engine import Engine, EngineConfig, EngineRequest
from gpufleet.perf.step_time import LinearStepTimeModel
from gpufleet.replica.runner import EngineRunner


async def test_idle_engine_clock_starts_at_arrival_not_at_submit() -> None:
    step_s = 0.02
    engine = Engine(
        EngineConfig(num_gpu_blocks=64, max_model_len=1024),
        LinearStepTimeModel(base_s=step_s),
        seed=0,
    )
    runner = EngineRunner(engine)
    runner.start()
    await asyncio.sleep(0)  # the loop is running and idle, as in a serving replica
    try:
        received = time.monotonic()
        await asyncio.sleep(0.01)  # the server reads and tokenizes the request meanwhile
        stream = runner.submit(EngineRequest("r1", [11, 12, 13], 1), received_wall_s=received)
        assert stream.arrival_wall_s == received
        await stream.wait()
        # The first (and only) step ends one step after the arrival: the server's work
        # overlapped the simulated GPU time instead of delaying the first token.
        assert abs(runner._target_wall_s - (received + step_s)) < 1e-9
    finally:
        await runner.stop()


async def test_requests_arriving_together_share_the_first_step() -> None:
    """vLLM's engine drains its whole input queue before a step; so does the runner after an
    idle spell, instead of stepping with whichever request happened to be parsed first."""
    engine = Engine(
        EngineConfig(num_gpu_blocks=64, max_model_len=1024),
        LinearStepTimeModel(base_s=0.02),
        seed=0,
    )
    steps: list[list[str]] = []
    runner = EngineRunner(
        engine, on_step=lambda out: steps.append(sorted(r.request_id for r in out.emitted))
    )
    runner.start()
    await asyncio.sleep(0)  # the loop is running and idle
    try:
        first = runner.submit(EngineRequest("r1", [11, 12, 13], 1))
        await asyncio.sleep(0)  # a second handler finishes parsing one loop turn later
        second = runner.submit(EngineRequest("r2", [21, 22, 23], 1))
        await first.wait()
        await second.wait()
        assert steps[0] == ["r1", "r2"]
    finally:
        await runner.stop()
