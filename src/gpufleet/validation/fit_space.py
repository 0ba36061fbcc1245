"""The fit's coordinates (`validation.fit`): a calibration's fitted constants as knobs
(a constant, and the engine it belongs to or None), their values in log space with an
offset that lets a search reach a zero bound, and moves inside the physical bounds."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from gpufleet.perf.calibration import (
    BACKEND_CONSTANTS,
    BOUNDS,
    PRIOR_BACKENDS,
    SCALAR_CONSTANTS,
    Calibration,
)

# A constant and the engine it belongs to (None: a shared scalar). An engine field of
# several names joined by "+" ("sglang+trtllm+vllm") is one knob that sets that constant
# alike in each of them: one value the engines share (`FitSpace.shared_backend_constants`).
Knob = tuple[str, str | None]
TIE = "+"


@dataclasses.dataclass(frozen=True)
class FitSpace:
    """Which engine constants `validation.fit` tunes, as an argument (`fit.prepare`,
    `fit.fit`, `fit.at_prior_where_frozen`); every default is the shipped fit's.

    backend_constants: the engine constants the fit may move (all of an engine's).
    frozen_backend_constants: of those, the ones held at their prior: the first-token
      iterations at the closed loop's phase (0.5), docs/performance-model.md, "Wave 16:
      first-token cost".
    shared_backend_constants: tuned as one value shared by the `sharing_engines` it fits
      (empty: all; a fold without an engine's MoE rows then gives it the others' value, not
      the prior). docs/performance-model.md, "Wave 15: held-out"."""

    backend_constants: tuple[str, ...] = BACKEND_CONSTANTS
    frozen_backend_constants: tuple[str, ...] = ("first_token_iterations",)
    shared_backend_constants: tuple[str, ...] = ()
    sharing_engines: tuple[str, ...] = ()

    @property
    def fitted_backend_constants(self) -> list[str]:
        """The engine constants the fit moves: listed and not frozen."""
        return [k for k in self.backend_constants if k not in self.frozen_backend_constants]


SHIPPED_SPACE = FitSpace()


def knob_backends(backend: str | None) -> list[str]:
    """The engines a knob's engine field names (none for a shared scalar)."""
    return [] if backend is None else backend.split(TIE)


def replace_constant(cal: Calibration, key: str, value: float, backend: str | None) -> Calibration:
    changes: dict[str, Any] = {key: value}
    if backend is None:
        return dataclasses.replace(cal, **changes)
    backends = dict(cal.backends)
    backends[backend] = dataclasses.replace(cal.backend(backend), **changes)
    return dataclasses.replace(cal, backends=MappingProxyType(backends))


def inside_bounds(cal: Calibration) -> Calibration:
    """Start from constants moved inside their bounds (a calibration written under older,
    wider bounds would otherwise stay outside: the search never steps back in past a
    worse score)."""
    for key in SCALAR_CONSTANTS:
        lo, hi = BOUNDS[key]
        cal = replace_constant(cal, key, min(hi, max(lo, float(getattr(cal, key)))), None)
    for name, b in cal.backends.items():
        for key in BACKEND_CONSTANTS:
            lo, hi = BOUNDS[key]
            cal = replace_constant(cal, key, min(hi, max(lo, float(getattr(b, key)))), name)
    return cal


def log_offset(key: str) -> float:
    """Log-space offset of a constant: 0 where its lower bound is positive; a hundredth of
    its upper bound where the bound is 0, so the search can reach 0 (the old multiplicative
    steps never could) and step out of it by the same ratios as elsewhere."""
    lo, hi = BOUNDS[key]
    return 0.0 if lo > 0 else hi * 0.01


def to_log(key: str, value: float) -> float:
    return math.log(value + log_offset(key))


def from_log(key: str, x: float) -> float:
    lo, hi = BOUNDS[key]
    return min(hi, max(lo, math.exp(x) - log_offset(key)))


def log_midpoint(key: str) -> float:
    """The middle of a constant's bounds in the search's own coordinates."""
    lo, hi = BOUNDS[key]
    return from_log(key, (to_log(key, lo) + to_log(key, hi)) / 2)


def value_of(cal: Calibration, knob: Knob) -> float:
    """A knob's value (a tied knob's: its first engine's; `moved` keeps them equal)."""
    key, backend = knob
    names = knob_backends(backend)
    return float(getattr(cal.backend(names[0]) if names else cal, key))


def moved(cal: Calibration, changes: Sequence[tuple[Knob, float]]) -> Calibration:
    for (key, backend), value in changes:
        names: list[str | None] = [*knob_backends(backend)] or [None]
        for name in names:
            cal = replace_constant(cal, key, value, name)
    return cal


# An engine constant that no training row informs (an engine that served no MoE model in
# the rows: its MoE constants; an engine with no rows at all: all of its constants) takes
# the mean, in the search's log coordinates, of the values the engines whose rows do inform
# it reached, instead of the data-free prior: every engine's rows reject that prior the
# same way (MoE GEMMs at 0.21-0.45 of dense against the kernels' 0.9, first-token overheads
# of 30-110 ms against 20, per-sequence costs of 21-86 µs against 10), so what the other
# engines show is the better a priori value for one the rows do not measure. Those constants
# move no training row's prediction, so the training objective is unchanged; only held-out
# rows of an engine the training rows lack (a fold's) read them. docs/performance-model.md,
# "Wave 18: what the rows cannot pin". The planner's "default" engine stays at the prior.
POOL_UNINFORMED = True


def pooled_where_uninformed(cal: Calibration, knobs: Sequence[Knob]) -> Calibration:
    """`cal` with each engine constant that no knob moves for an engine of
    `perf.calibration.PRIOR_BACKENDS`, but some knob moves for another, at the informed
    engines' mean in log coordinates (`POOL_UNINFORMED`; frozen constants are no knob and
    stay at the prior)."""
    if not POOL_UNINFORMED:
        return cal
    for key in BACKEND_CONSTANTS:
        informed = sorted({n for k, b in knobs if k == key for n in knob_backends(b)})
        if not informed:
            continue
        x = statistics.fmean(to_log(key, float(getattr(cal.backend(n), key))) for n in informed)
        for name in PRIOR_BACKENDS:
            if name not in informed:
                cal = replace_constant(cal, key, from_log(key, x), name)
    return cal


# Partial pooling of the engines' fixed first-token constant (docs/performance-model.md,
# "Wave 19: the first-token constant, partly pooled"): every engine's OpenAI front end does
# the same per-request work before the first token (HTTP, tokenizing the prompt, the hand-off
# to the scheduler, the first streamed chunk), in different code (processes, IPC,
# serialisation), so a priori the engines' `ttft_overhead_s` scatter around one value by a
# factor of about 2 (one standard deviation in log, `POOL_SPREAD`), not independently over
# their bounds. The fit adds the negative log density of that Gaussian (its centre, the
# engines' log-mean, left free) to its loss, per campaign: the loss is a per-observation
# Laplace log-likelihood with the target as its scale, and an engine's first-token wait is
# observed once per campaign (its rows share it), so the prior weighs 1 / campaigns against
# it. Decided from that reasoning before any held-out run; ("ttft_overhead_s",) turns it
# on. Off: held out it moved each fold's search into other basins of the constants the fold
# does not pin (LOMO 28.6 / 9.8 -> 31.2 / 16.7 %, LOGO 27.3 / 8.2 -> 25.1 / 8.0; the doc's
# "Wave 19" section), so the fit is main's.
POOLED_CONSTANTS: tuple[str, ...] = ()
POOL_SPREAD = math.log(2.0)


def pool_penalty(cal: Calibration, knobs: Sequence[Knob], campaigns: int) -> float:
    """The partial pool's penalty for `cal`: per `POOLED_CONSTANTS` key, half the sum of the
    engines' squared log distances from their log-mean in units of `POOL_SPREAD`, over
    `campaigns` (0 with fewer than two engines fitting the constant)."""
    total = 0.0
    for key in POOLED_CONSTANTS:
        xs = [to_log(key, value_of(cal, k)) for k in knobs if k[0] == key and k[1] is not None]
        if len(xs) < 2 or campaigns <= 0:
            continue
        mean = statistics.fmean(xs)
        total += 0.5 * sum(((x - mean) / POOL_SPREAD) ** 2 for x in xs) / campaigns
    return total


# Closer than this fraction of a bound's range to the bound counts as pinned at it (the
# shipped constants' test, tests/plan/test_calibration.py, uses the same margin).
PIN_MARGIN = 0.01


def pinned_constants(cal: Calibration, margin: float = PIN_MARGIN) -> list[str]:
    """The constants of `cal` at (or past) one of their bounds, by name: a fit that presses
    a constant there compensates for something the model lacks."""
    values = [(k, float(getattr(cal, k))) for k in SCALAR_CONSTANTS]
    for name, b in sorted(cal.backends.items()):
        values += [(f"{name}.{k}", float(getattr(b, k))) for k in BACKEND_CONSTANTS]
    out = []
    for name, v in values:
        lo, hi = BOUNDS[name.rsplit(".", 1)[-1]]
        slack = margin * (hi - lo)
        if not lo + slack < v < hi - slack:
            out.append(name)
    return out
