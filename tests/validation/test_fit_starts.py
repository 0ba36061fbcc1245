"""The fit's starting points, its pull toward the prior (ridge) and the check that no
constant is pressed against a bound, on synthetic objectives and calibrations."""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from gpufleet.errors import UserError
from gpufleet.perf.calibration import BOUNDS, Calibration, default_calibration, prior_calibration
from gpufleet.validation import fit as fit_module
from gpufleet.validation import fit_space, fit_starts
from gpufleet.validation.fit_space import log_midpoint, pinned_constants


def _rows(backend: str = "sglang") -> list[Any]:
    return [SimpleNamespace(backend=backend, model_path="m")]


def _search(
    rows: list[Any], ridge: float = 0.0, space: fit_space.FitSpace = fit_space.SHIPPED_SPACE
) -> tuple[Any, Calibration]:
    return fit_module.prepare(rows, prior_calibration(), ridge=ridge, space=space)


def test_seeded_starts_are_deterministic_inside_the_bounds_and_differ() -> None:
    search, prior = _search(_rows())
    a = fit_starts.start_point(search, prior, "seed1")
    assert a == fit_starts.start_point(search, prior, "seed1")
    assert a != fit_starts.start_point(search, prior, "seed2") and a != prior
    for key, backend in search.knobs:
        value = getattr(a if backend is None else a.backend(backend), key)
        lo, hi = BOUNDS[key]
        assert lo <= value <= hi


def test_a_seed_moves_a_constant_alike_in_folds_with_other_engines() -> None:
    """One random stream per (seed, constant): a fold without vLLM's rows does not shift
    the draws of SGLang's constants."""
    one, prior = _search(_rows("sglang"))
    both, _ = _search([*_rows("sglang"), *_rows("vllm")])
    a = fit_starts.start_point(one, prior, "seed3").backend("sglang")
    b = fit_starts.start_point(both, prior, "seed3").backend("sglang")
    assert a == b


def test_the_midpoint_and_shipped_starts() -> None:
    search, prior = _search(_rows())
    mid = fit_starts.start_point(search, prior, "midpoint")
    assert mid.backend("sglang").ttft_overhead_s == pytest.approx(log_midpoint("ttft_overhead_s"))
    shipped = fit_starts.start_point(search, prior, "shipped")
    got, want = shipped.backend("sglang"), default_calibration().backend("sglang")
    for key in ("step_overhead_s", "seq_overhead_s", "ttft_overhead_s"):
        assert getattr(got, key) == getattr(want, key)
    # No MoE row here: the MoE constants are not fitted and stay at the prior.
    assert got.moe_efficiency == prior.backend("sglang").moe_efficiency
    with pytest.raises(UserError):
        fit_starts.start_point(search, prior, "seedling")


def test_the_lowest_training_objective_wins_first_on_ties() -> None:
    fits = [fit_starts.StartFit(label, obj, {}) for label, obj in
            (("prior", 2.0), ("midpoint", 1.0), ("seed1", 1.0))]  # fmt: skip
    assert fit_starts.best_start(fits).label == "midpoint"


def test_the_ridge_pulls_a_constant_no_row_informs_back_to_its_prior(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only SGLang's per-sequence overhead moves the (synthetic) errors; its step overhead
    informs nothing. From the midpoint, the plain fit leaves the step overhead there; with
    a ridge the search walks it back to the prior (3 ms) and still fits the informed one."""

    def errors(cal: Calibration, row: Any, recipes: bool) -> tuple[float, float]:
        return 0.0, abs(math.log(cal.backend("sglang").seq_overhead_s / 50e-6 + 1e-9))

    monkeypatch.setattr(fit_module, "_errors", errors)
    rows = _rows()
    results = {}
    for ridge in (0.0, 0.01):
        search, prior = _search(rows, ridge)
        start = fit_starts.start_point(search, prior, "midpoint")
        results[ridge], _ = fit_module.descend(search, start, fit_module.sweep_steps(3))
    plain, pulled = results[0.0].backend("sglang"), results[0.01].backend("sglang")
    assert plain.step_overhead_s == pytest.approx(log_midpoint("step_overhead_s"))
    assert pulled.step_overhead_s == pytest.approx(3e-3, rel=0.1)
    assert pulled.seq_overhead_s == pytest.approx(50e-6, rel=0.1)


def test_the_ridge_costs_nothing_at_the_prior_and_grows_away_from_it() -> None:
    search, prior = _search(_rows(), ridge=0.1)
    assert search.penalty(prior) == 0.0
    mid = fit_starts.start_point(search, prior, "midpoint")
    assert search.penalty(mid) > 0.0
    with pytest.raises(UserError):
        fit_module.prepare(_rows(), prior_calibration(), ridge=-1.0)


def test_a_constant_at_a_bound_is_named_and_the_shipped_ones_are_not() -> None:
    """The check the benchmark reports for its candidate calibration (and the shipped
    constants' test, tests/plan/test_calibration.py) fails on a pinned constant."""
    shipped = default_calibration()
    assert pinned_constants(shipped) == []
    hi = BOUNDS["ttft_overhead_s"][1]
    backends = dict(shipped.backends)
    backends["vllm"] = dataclasses.replace(backends["vllm"], ttft_overhead_s=hi)
    pinned = dataclasses.replace(
        shipped, backends=MappingProxyType(backends), routing_skew=BOUNDS["routing_skew"][0]
    )
    assert pinned_constants(pinned) == ["routing_skew", "vllm.ttft_overhead_s"]


def test_a_search_run_to_convergence_ends_no_higher_and_at_a_fixed_point() -> None:
    """`descend(..., converge=True)` continues from where the fixed rounds stop, so on the
    sample rows it ends at or below their objective; it stops, and where it stops a further
    converged search accepts no move."""
    from gpufleet.validation.measured import read_rows

    from .helpers import SAMPLE

    rows = [r for r in read_rows(SAMPLE) if r.system != "tpu_v9"]  # the modelled ones
    search, prior = fit_module.prepare(rows, prior_calibration())
    steps = fit_module.sweep_steps(1)
    _, fixed = fit_module.descend(search, prior, steps)
    cal, converged = fit_module.descend(search, prior, steps, converge=True)
    assert converged <= fixed
    assert converged == pytest.approx(fit_module.training_objective(search, cal))
    again, settled = fit_module.descend(search, cal, [], converge=True)
    assert settled == converged and again == cal


def test_a_shared_engine_constant_is_one_knob_that_moves_every_engine_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shared MoE constant is fitted once for every engine of the fit: an engine that
    served no MoE model in the training rows (vLLM below) gets the others' value, not
    the prior; a frozen constant is no knob and stays at the prior."""
    monkeypatch.setattr(fit_module, "_is_moe", lambda row: row.model_path == "moe")
    space = fit_space.FitSpace(
        frozen_backend_constants=("moe_layer_overhead_s",),
        shared_backend_constants=("moe_efficiency",),
    )
    rows = [SimpleNamespace(backend="sglang", model_path="moe"), *_rows("vllm")]
    search, prior = _search(rows, space=space)
    knobs = set(search.knobs)
    assert ("moe_efficiency", "sglang+vllm") in knobs
    assert not {("moe_efficiency", "sglang"), ("moe_efficiency", "vllm")} & knobs
    assert not any(k == "moe_layer_overhead_s" for k, _ in knobs)
    assert ("moe_gemm_efficiency", "sglang") in knobs  # own, MoE rows: fitted
    assert ("moe_gemm_efficiency", "vllm") not in knobs  # own, no MoE rows: prior
    moved = fit_space.moved(prior, [(("moe_efficiency", "sglang+vllm"), 0.5)])
    assert moved.backend("sglang").moe_efficiency == moved.backend("vllm").moe_efficiency == 0.5
    assert fit_space.value_of(moved, ("moe_efficiency", "sglang+vllm")) == 0.5
    assert list(search.affected([("moe_efficiency", "sglang+vllm")])) == [0, 1]
    three, _ = _search(
        [*rows, *_rows("trtllm"), SimpleNamespace(backend="trtllm", model_path="moe")],
        space=dataclasses.replace(space, sharing_engines=("sglang", "vllm")),
    )
    assert {("moe_efficiency", "sglang+vllm"), ("moe_efficiency", "trtllm")} <= set(three.knobs)
    raised = {
        n: dataclasses.replace(b, moe_layer_overhead_s=1e-4)
        for n, b in default_calibration().backends.items()
    }
    shipped = dataclasses.replace(default_calibration(), backends=MappingProxyType(raised))
    frozen = fit_module.at_prior_where_frozen(shipped, space)
    for name in ("sglang", "vllm"):
        assert frozen.backend(name).moe_layer_overhead_s == prior.backend(name).moe_layer_overhead_s


def test_constants_no_row_informs_take_the_informed_engines_log_mean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine that served no MoE model in the training rows gets the MoE constants the
    engines that did reached (their mean in log coordinates), not the kernels' prior; an
    engine with no rows gets every fitted constant so; frozen constants and the planner's
    "default" engine stay at the prior; without the switch nothing is pooled."""
    monkeypatch.setattr(fit_module, "_is_moe", lambda row: row.model_path == "moe")
    rows = [SimpleNamespace(backend=b, model_path="moe") for b in ("sglang", "trtllm")]
    search, prior = _search([*rows, *_rows("vllm")])
    assert ("moe_gemm_efficiency", "vllm") not in search.knobs
    cal = fit_space.moved(
        prior,
        [
            (("moe_gemm_efficiency", "sglang"), 0.3),
            (("moe_gemm_efficiency", "trtllm"), 0.5),
            (("moe_layer_overhead_s", "sglang"), 20e-6),
            (("moe_layer_overhead_s", "trtllm"), 80e-6),
            (("ttft_overhead_s", "vllm"), 0.05),
        ],
    )
    pooled = fit_space.pooled_where_uninformed(cal, search.knobs)
    vllm = pooled.backend("vllm")
    assert vllm.moe_gemm_efficiency == pytest.approx(math.sqrt(0.3 * 0.5))
    offset = fit_space.log_offset("moe_layer_overhead_s")
    want = math.sqrt((20e-6 + offset) * (80e-6 + offset)) - offset
    assert vllm.moe_layer_overhead_s == pytest.approx(want)
    assert vllm.ttft_overhead_s == 0.05  # informed by vLLM's own rows: its own value
    assert pooled.backend("sglang") == cal.backend("sglang")
    assert pooled.backend("default") == prior.backend("default")
    assert vllm.first_token_iterations == prior.backend("vllm").first_token_iterations
    # An engine with no rows at all: every fitted constant pooled.
    two, _ = _search(rows)
    alone = fit_space.pooled_where_uninformed(cal, two.knobs).backend("vllm")
    assert alone.ttft_overhead_s == pytest.approx(math.sqrt(0.02 * 0.02))
    assert alone.moe_gemm_efficiency == pytest.approx(math.sqrt(0.3 * 0.5))
    monkeypatch.setattr(fit_space, "POOL_UNINFORMED", False)
    assert fit_space.pooled_where_uninformed(cal, search.knobs) == cal


def test_pooling_leaves_the_training_objective_unchanged() -> None:
    """The sample rows hold no SGLang row: the fit pools SGLang's constants, and the
    objective it reports is the pooled calibration's own on the training rows."""
    from gpufleet.validation.measured import read_rows

    from .helpers import SAMPLE

    rows = [r for r in read_rows(SAMPLE) if r.system != "tpu_v9"]
    search, prior = fit_module.prepare(rows, prior_calibration())
    cal, best = fit_module.descend(search, prior, fit_module.sweep_steps(1))
    assert cal.backend("sglang") != prior.backend("sglang")
    assert best == pytest.approx(fit_module.training_objective(search, cal))
    ttft = [cal.backend(b).ttft_overhead_s for b in ("trtllm", "vllm")]
    offset = fit_space.log_offset("ttft_overhead_s")
    want = math.sqrt((ttft[0] + offset) * (ttft[1] + offset)) - offset
    assert cal.backend("sglang").ttft_overhead_s == pytest.approx(want)


def test_the_first_token_constants_are_pooled_partly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switched on, the fit's loss carries the partial pool of the engines' `ttft_overhead_s`:
    half the squared log distances from their log-mean over `POOL_SPREAD`, per campaign;
    none with the engines alike, none with one engine, none switched off (the default)."""
    monkeypatch.setattr(fit_space, "POOLED_CONSTANTS", ("ttft_overhead_s",))
    rows = [
        SimpleNamespace(backend=b, model_path=m) for b in ("trtllm", "vllm") for m in ("m1", "m2")
    ]
    search, prior = _search(rows)
    assert len(search.groups) == 4
    alike = fit_space.moved(prior, [(("ttft_overhead_s", b), 0.05) for b in ("trtllm", "vllm")])
    assert search.penalty(alike) == 0.0
    apart = fit_space.moved(
        prior, [(("ttft_overhead_s", "trtllm"), 0.2), (("ttft_overhead_s", "vllm"), 0.02)]
    )
    offset = fit_space.log_offset("ttft_overhead_s")
    half_gap = math.log((0.2 + offset) / (0.02 + offset)) / 2
    want = 0.5 * 2 * (half_gap / math.log(2.0)) ** 2 / 4
    assert search.penalty(apart) == pytest.approx(want)
    one, _ = _search(_rows("vllm"))
    assert one.penalty(apart) == 0.0
    # On predictable rows the search minimises the loss plus the pool.
    from gpufleet.validation.measured import read_rows

    from .helpers import SAMPLE

    sample = [r for r in read_rows(SAMPLE) if r.system != "tpu_v9"]
    real, _ = fit_module.prepare(sample, prior_calibration())
    pool = real.penalty(apart)
    assert pool > 0.0
    assert fit_module.training_objective(real, apart) == pytest.approx(
        fit_module.objective(apart, sample) + pool
    )
    monkeypatch.setattr(fit_space, "POOLED_CONSTANTS", ())
    assert search.penalty(apart) == 0.0
