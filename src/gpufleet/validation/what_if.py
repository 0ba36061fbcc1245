"""Counterfactuals on a measured row's prediction (`measured.model_row`), passed in as data.

A diagnostic asks "what if the engine ran at most 96 requests" or "what if the front end
also paid for each prompt token" by handing `measured.predict_rows(..., what_if=...)` a
`WhatIf` whose hooks replace the two seams of a row's analytic prediction: the rules the
row's launch set on its engine (`row_rules`, by default `recipes.batch_wait_rules`) and the
closed-loop solver (`closed_loop`, by default `plan.closed_loop.predict_closed_loop`).
`SHIPPED` (every default) is the model as shipped; the what-if shows at the call site,
nothing is patched, and threads or a compiled build see the same behaviour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpufleet.perf.step_time import StepTimeModel
from gpufleet.plan.closed_loop import SchedulerShape, ServingPrediction, predict_closed_loop
from gpufleet.plan.engines import EngineRules
from gpufleet.validation.recipes import batch_wait_rules
from gpufleet.validation.rows import MeasuredRow

__all__ = ["SHIPPED", "ClosedLoop", "RowRules", "WhatIf", "running_cap"]

# The engine rules a row ran, from the engine's defaults (`recipes.batch_wait_rules`'s form).
RowRules = Callable[[MeasuredRow, EngineRules], EngineRules]


class ClosedLoop(Protocol):
    """The closed-loop solver as `measured.model_row` calls it (`predict_closed_loop`'s
    form, with the keywords it passes)."""

    def __call__(
        self,
        model: StepTimeModel,
        input_tokens: int,
        output_tokens: int,
        concurrency: int,
        scheduler: SchedulerShape | None = None,
        *,
        ttft_overhead_s: float = 0.0,
        queue_scale: float = 1.0,
        requests_per_client: float | None = None,
    ) -> ServingPrediction: ...


@dataclass(frozen=True)
class WhatIf:
    """How a row's prediction departs from the shipped model (each default: as shipped).

    row_rules: the row's engine rules from the engine's defaults, used where the row's
      launch recipes are not asked for (`recipes=False`, the default; with them
      `recipes.recipe_rules` runs and this is not called).
    closed_loop: the analytic closed-loop solver (the engine mode does not call it)."""

    row_rules: RowRules = batch_wait_rules
    closed_loop: ClosedLoop = predict_closed_loop


SHIPPED = WhatIf()


def running_cap(engine: str, cap: int, base: RowRules = batch_wait_rules) -> RowRules:
    """`base`'s rules, with `engine` running at most `cap` requests at once (its
    max_num_seqs / max_batch_size); other engines' rules unchanged."""

    def rules(row: MeasuredRow, r: EngineRules) -> EngineRules:
        r = base(row, r)
        if r.name != engine:
            return r
        return dataclasses.replace(r, max_num_seqs=min(cap, r.max_num_seqs))

    return rules
