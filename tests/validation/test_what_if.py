"""The what-ifs as arguments: `measured.predict_rows(..., what_if=)` and the fit's
`FitSpace`; each default is the shipped model, each knob changes what it names only."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpufleet.perf.calibration import BACKEND_CONSTANTS, default_calibration, prior_calibration
from gpufleet.plan.closed_loop import ServingPrediction, predict_closed_loop
from gpufleet.validation import fit as fit_module
from gpufleet.validation.fit_space import SHIPPED_SPACE, FitSpace, replace_constant
from gpufleet.validation.measured import predict_rows, read_rows
from gpufleet.validation.recipes import batch_wait_rules
from gpufleet.validation.what_if import SHIPPED, WhatIf, running_cap

from .helpers import CONFIGS, SAMPLE

KNOB = "first_token_iterations"


def _predict(what_if: WhatIf | None = None, **kw: Any) -> dict[str, tuple[float, float]]:
    rows = read_rows(SAMPLE)
    if what_if is None:
        preds, _ = predict_rows(rows, None, CONFIGS, **kw)
    else:
        preds, _ = predict_rows(rows, None, CONFIGS, what_if=what_if, **kw)
    return {p.row.id: (p.ttft_s, p.tpot_s) for p in preds}


def test_the_default_what_if_is_the_shipped_model() -> None:
    base = _predict()
    assert base and len(base) == len(read_rows(SAMPLE)) - 1  # the unknown GPU's row
    assert SHIPPED == WhatIf() == WhatIf(batch_wait_rules, predict_closed_loop)
    assert _predict(SHIPPED) == base
    assert _predict(WhatIf(row_rules=batch_wait_rules)) == base


def test_a_running_cap_changes_its_engines_rows_only() -> None:
    base = _predict()
    rows = {r.id: r for r in read_rows(SAMPLE)}
    capped = _predict(WhatIf(row_rules=running_cap("trtllm", 1)))
    assert capped.keys() == base.keys()
    trtllm = [i for i in base if rows[i].backend == "trtllm"]
    assert trtllm and len(trtllm) < len(base)
    for i in base:
        if i in trtllm:  # 8 clients, one running: the others queue for their first token
            assert capped[i][0] > base[i][0] * 1.5
        else:
            assert capped[i] == base[i]


def test_the_recipes_rules_ignore_the_row_rules_what_if() -> None:
    """With the launch recipes the row's rules are `recipes.recipe_rules` (as documented on
    `WhatIf.row_rules`): the what-if's rules are not called."""

    def fail(row: Any, rules: Any) -> Any:
        raise AssertionError("row_rules called under recipes=True")

    assert _predict(WhatIf(row_rules=fail), recipes=True) == _predict(recipes=True)


def test_the_closed_loop_what_if_is_the_solver_each_row_uses() -> None:
    seen: list[int] = []

    def later(*args: Any, **kw: Any) -> ServingPrediction:
        seen.append(args[3])  # the clients of one attention rank
        out = predict_closed_loop(*args, **kw)
        return dataclasses.replace(out, ttft_s=out.ttft_s + 1.0)

    base = _predict()
    shifted = _predict(WhatIf(closed_loop=later))
    assert len(seen) == len(base)
    for i, (ttft_s, tpot_s) in base.items():
        assert shifted[i] == (ttft_s + 1.0, tpot_s)


def test_what_ifs_run_side_by_side_in_threads() -> None:
    """Nothing global changes: a capped run and a shipped one at once give each its own."""
    base = _predict()
    capped = _predict(WhatIf(row_rules=running_cap("trtllm", 1)))
    jobs = [SHIPPED, WhatIf(row_rules=running_cap("trtllm", 1))] * 4
    with ThreadPoolExecutor(max_workers=2) as pool:
        got = list(pool.map(_predict, jobs))
    assert got == [base, capped] * 4


def _held_or_fitted(fitted: bool) -> FitSpace:
    """plan_first_token's forms: the iterations held at the start's value or fitted."""
    keys = BACKEND_CONSTANTS if fitted else tuple(k for k in BACKEND_CONSTANTS if k != KNOB)
    return FitSpace(backend_constants=keys, frozen_backend_constants=())


def test_the_shipped_fit_space_freezes_the_first_token_iterations_at_the_prior() -> None:
    rows = read_rows(SAMPLE)
    start = default_calibration()
    for b in start.backends:
        start = replace_constant(start, KNOB, 3.0, b)
    search, cal = fit_module.prepare(rows, start)
    assert search.space == SHIPPED_SPACE == FitSpace()
    assert SHIPPED_SPACE.frozen_backend_constants == (KNOB,)
    assert not any(k == KNOB for k, _ in search.knobs)
    for b in cal.backends:
        assert (
            cal.backend(b).first_token_iterations
            == prior_calibration().backend(b).first_token_iterations
        )
    explicit, same = fit_module.prepare(rows, start, space=FitSpace())
    assert explicit.knobs == search.knobs and same == cal


def test_plan_first_token_forms_hold_or_fit_the_iterations_from_their_start() -> None:
    """What the benchmark's patched globals (BACKEND_CONSTANTS without the knob or with it,
    nothing frozen) gave: the iterations kept at the start's value, a knob per engine only
    when fitted; every other knob as the shipped fit's."""
    rows = read_rows(SAMPLE)
    start = default_calibration()
    for b in start.backends:
        start = replace_constant(start, KNOB, 0.0, b)
    shipped, _ = fit_module.prepare(rows, start)
    engines = sorted({r.backend for r in rows} & set(start.backends))
    for fitted in (False, True):
        search, cal = fit_module.prepare(rows, start, space=_held_or_fitted(fitted))
        for b in cal.backends:
            assert cal.backend(b).first_token_iterations == 0.0
        added = [k for k in search.knobs if k not in shipped.knobs]
        assert added == ([(KNOB, b) for b in engines] if fitted else [])
        assert [k for k in search.knobs if k[0] != KNOB] == shipped.knobs


def test_a_fit_in_a_space_moves_only_its_knobs() -> None:
    rows = [r for r in read_rows(SAMPLE) if r.system != "tpu_v9"]
    start = default_calibration()
    for b in start.backends:
        start = replace_constant(start, KNOB, 0.0, b)
    held = fit_module.fit(rows, start, rounds=1, restarts=False, space=_held_or_fitted(False))
    assert all(held.backend(b).first_token_iterations == 0.0 for b in held.backends)
    moved = fit_module.fit(rows, start, rounds=1, restarts=False, space=_held_or_fitted(True))
    assert any(moved.backend(b).first_token_iterations != 0.0 for b in moved.backends)
