"""The engine driver's advances: a decode run is one advance, cut short where a request
arrives or is aborted, and what it delivers (and what /metrics reads meanwhile) is what
stepping one iteration at a time gives."""

from __future__ import annotations

from gpufleet.engine import Advance, Engine, EngineConfig, EngineDriver, EngineRequest
from gpufleet.perf.step_time import LinearStepTimeModel

MODEL = LinearStepTimeModel(base_s=0.0103, per_token_s=3.1e-5, per_context_token_s=2.3e-7)
CONFIG = EngineConfig(num_gpu_blocks=64, block_size=16, max_model_len=512)


def engine() -> Engine:
    return Engine(CONFIG, MODEL, seed=5)


def decoding(driver: EngineDriver) -> Advance:
    """Two requests past their prefill; the next advance is a run of decode steps."""
    driver.submit(EngineRequest("a", [3] * 40, 200, seed=1), 0.0)
    driver.submit(EngineRequest("b", [4] * 70, 30, seed=2), 0.0)
    first = driver.begin_advance()  # the prefill step
    assert first is not None and first.run is None
    driver.end(first)
    advance = driver.begin_advance()
    assert advance is not None and advance.run is not None
    return advance


def stepped_until(t_s: float) -> tuple[Engine, list[float]]:
    """Stepping, with what began by `t_s` done (its iteration end times)."""
    e = engine()
    d = EngineDriver(e)
    d.submit(EngineRequest("a", [3] * 40, 200, seed=1), 0.0)
    d.submit(EngineRequest("b", [4] * 70, 30, seed=2), 0.0)
    d.begin()
    ends = []
    while e.now_s <= t_s:
        out = d.begin()
        assert out is not None
        ends.append(out.now_s)
    return e, ends


def test_a_run_is_delivered_at_its_end_with_every_token_time() -> None:
    d = EngineDriver(engine())
    advance = decoding(d)
    assert advance.run is not None
    steps = advance.run.num_steps
    assert steps == 29  # b finishes after its 30th token (1 came with its prefill)
    outcome = d.end(advance)
    assert outcome.now_s == advance.due_s == d.engine.now_s
    assert [r.request_id for r in outcome.finished] == ["b"]
    ref, ends = stepped_until(outcome.step_end_s[-2])  # every step of the run began
    assert outcome.step_end_s == ends
    assert d.engine.stats == ref.stats


def test_an_arrival_cuts_the_run_at_the_iteration_in_progress() -> None:
    d = EngineDriver(engine())
    advance = decoding(d)
    assert advance.run is not None
    planned_due = advance.due_s
    t = (advance.run.step_end_s[4] + advance.run.step_end_s[5]) / 2  # inside step 6
    d.submit(EngineRequest("c", [5] * 20, 5, seed=3), t)
    assert advance.run is None and advance.due_s < planned_due
    ref, ends = stepped_until(t)
    assert advance.due_s == ends[-1] == d.engine.now_s  # the iteration that began by t
    outcome = d.end(advance)
    assert outcome.num_steps == 6 and outcome.step_end_s == ends[-6:]
    ref.add(EngineRequest("c", [5] * 20, 5, seed=3, arrival_s=t))
    nxt, ref_next = d.begin_advance(), ref.step()
    assert nxt is not None and nxt.outcome is not None  # c's prefill: a plain step
    assert nxt.due_s == ref_next.now_s
    assert [r.request_id for r in nxt.outcome.emitted] == [r.request_id for r in ref_next.emitted]


def test_metrics_in_a_run_read_what_stepping_shows_without_cutting_it() -> None:
    d = EngineDriver(engine())
    advance = decoding(d)
    assert advance.run is not None
    for k in (0, 7, 20, 27):
        t = advance.run.step_end_s[k] - 1e-6
        ref, _ = stepped_until(t)
        assert d.metrics(t) == (ref.num_running, ref.num_waiting, ref.kv_cache_usage)
    assert advance.run is not None  # not cut
    late = advance.run.step_end_s[-2] + 1e-6  # the last (finishing) step has begun
    ref, _ = stepped_until(late)
    assert d.metrics(late) == (ref.num_running, ref.num_waiting, ref.kv_cache_usage)
    assert advance.run is None and advance.outcome is not None  # applied, due time unchanged
    assert advance.due_s == advance.outcome.now_s


def test_abort_cuts_the_run_and_drops_the_request() -> None:
    d = EngineDriver(engine())
    advance = decoding(d)
    assert advance.run is not None
    t = advance.run.step_end_s[2] + 1e-6
    aborted = d.abort("a", t)
    assert aborted is not None and aborted.num_output_tokens == 1 + 4
    assert d.engine.get("a") is None and d.engine.num_running == 1
    assert advance.outcome is not None and advance.outcome.num_steps == 4


def test_a_micro_batch_ending_with_the_one_before_is_a_step_not_a_block() -> None:
    """With PP, micro-batches leave the pipeline in order, so one holding part of a prefill
    may end at the same instant as the one before it: no time passes and no token comes
    out, but the engine ran it. `begin` must not take that for "blocked" (and wait)."""
    cfg = EngineConfig(
        num_gpu_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=3,
        max_model_len=64, pipeline_stages=3, enable_prefix_caching=False,
    )  # fmt: skip
    d = EngineDriver(Engine(cfg, LinearStepTimeModel(base_s=0.001, per_seq_s=0.01)))
    d.submit(EngineRequest("a", [7] * 5, 4), 0.0)
    d.submit(EngineRequest("b", [7] * 9, 4), 0.0)
    outcomes = []
    while d.engine.has_work:
        out = d.begin()
        assert out is not None
        outcomes.append(out)
    assert any(o.duration_s == 0 and not o.emitted for o in outcomes)
    assert sum(len(o.emitted) for o in outcomes) == 8
