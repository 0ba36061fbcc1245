"""The engine-driver contract (step at start, deliver at end), offline and exact."""

from __future__ import annotations

import pytest

from gpufleet.engine import Arrivals, Engine, EngineConfig, EngineDriver, EngineRequest, run_virtual
from gpufleet.perf.step_time import LinearStepTimeModel

# 10 ms per iteration plus 1 µs per token: times in the asserts are exact sums of these.
MODEL = LinearStepTimeModel(base_s=0.01, per_token_s=1e-6)


def driver() -> EngineDriver:
    cfg = EngineConfig(num_gpu_blocks=256, max_model_len=1024, enable_prefix_caching=False)
    return EngineDriver(Engine(cfg, MODEL, seed=1))


def req(rid: str, prompt: int = 100, out: int = 3, arrival_s: float | None = None) -> EngineRequest:
    return EngineRequest(rid, [7] * prompt, out, arrival_s=arrival_s)


def test_an_idle_engine_starts_at_the_arrival() -> None:
    d = driver()
    assert d.begin() is None and not d.engine.has_work  # idle: nothing ran
    d.submit(req("a"), 5.0)
    assert d.engine.now_s == 5.0 and d.engine.get("a").arrival_s == 5.0  # type: ignore[union-attr]
    first = d.begin()
    assert first is not None
    # Tokens are due at the iteration's end; the engine's clock is already there.
    assert first.now_s == d.engine.now_s == pytest.approx(5.0 + 0.01 + 100e-6, abs=1e-12)
    assert [r.request_id for r in first.emitted] == ["a"]
    # A request submitted while the engine is busy does not move its clock.
    d.submit(req("b"), 5.001)
    assert d.engine.now_s == first.now_s


def test_submitted_before_begin_joins_that_iteration_after_it_waits() -> None:
    """The runner and the simulator begin the next iteration at a delivery, before what the
    delivery causes arrives: a reply's next request joins the iteration after that."""
    joined, waited = driver(), driver()
    for d in (joined, waited):
        d.submit(req("x", out=10), 0.0)
        d.submit(req("a", out=1), 0.0)
        end = d.begin()
        assert end is not None and [r.request_id for r in end.finished] == ["a"]
    # a's client sends b at the delivery instant, before this driver begins the next step.
    joined.submit(req("b"), end.now_s)
    step = joined.begin()
    assert step is not None and {r.request_id for r in step.emitted} == {"x", "b"}
    # This one begins the next step first (x's decode), then b arrives: it waits a step.
    nxt = waited.begin()
    waited.submit(req("b"), end.now_s)
    assert nxt is not None and [r.request_id for r in nxt.emitted] == ["x"]
    step2 = waited.begin()
    assert step2 is not None and {r.request_id for r in step2.emitted} == {"x", "b"}
    assert step2.now_s > step.now_s


def test_run_virtual_admits_what_is_due_before_each_iteration() -> None:
    d = driver()
    arrivals: Arrivals[str] = Arrivals()
    arrivals.add(0.0, "a")
    arrivals.add(0.005, "b")  # during a's first iteration: joins the next one
    arrivals.add(1.0, "c")  # after everything: the engine idles until then
    admitted: list[tuple[float, str]] = []

    def admit(at_s: float, rid: str) -> EngineRequest:
        admitted.append((at_s, rid))
        return req(rid, arrival_s=at_s)

    firsts: dict[str, float] = {}
    steps = []
    for out in run_virtual(d, arrivals, admit):
        steps.append(out)
        for r in out.emitted:
            firsts.setdefault(r.request_id, out.now_s)
        if out.now_s > 0.05 and not arrivals and "d" not in firsts:
            arrivals.add(out.now_s, "d")  # a caller may add while iterating
            firsts["d"] = -1.0
    assert [rid for _, rid in admitted] == ["a", "b", "c", "d"]
    step1 = 0.01 + 100e-6
    assert firsts["a"] == pytest.approx(step1, abs=1e-12)
    # b arrived mid-step: its prefill starts with the second iteration, beside a's decode.
    assert firsts["b"] == pytest.approx(step1 + 0.01 + 101e-6, abs=1e-12)
    assert firsts["c"] == pytest.approx(1.0 + step1, abs=1e-12)
    assert all(s.duration_s > 0 for s in steps) and not d.engine.has_work


def test_run_virtual_matches_stepping_by_hand() -> None:
    def by_hand() -> list[tuple[float, list[str]]]:
        e = Engine(EngineConfig(num_gpu_blocks=256, max_model_len=1024), MODEL, seed=1)
        for i in range(5):
            e.add(req(f"r{i}", prompt=50 * (i + 1), out=4 + i, arrival_s=0.0))
        out = []
        while e.has_work:
            s = e.step()
            out.append((s.now_s, [r.request_id for r in s.emitted]))
        return out

    d = EngineDriver(Engine(EngineConfig(num_gpu_blocks=256, max_model_len=1024), MODEL, seed=1))
    arrivals: Arrivals[int] = Arrivals()
    for i in range(5):
        arrivals.add(0.0, i)

    def admit(t: float, i: int) -> EngineRequest:
        return req(f"r{i}", prompt=50 * (i + 1), out=4 + i, arrival_s=t)

    driven = [(s.now_s, [r.request_id for r in s.emitted]) for s in run_virtual(d, arrivals, admit)]
    assert driven == by_hand()
