"""Fits from several starting points (`validation.fit`'s search, each start on its own).

One descent from one start lands in one of several minima, and which one moves the held-out
figures by up to 19 points when a few training rows change (docs/performance-model.md, "The
TTFT leads of wave 13"). Here each fit runs from the prior, the middle of the bounds and a
few seeded perturbations of the prior (and, for in-sample fits only, the shipped constants),
keeps the start with the lowest TRAINING objective — never the held-out error, which would
leak — and returns every start's result, so a report can show how far the held-out error
spreads across starts. Starts run in a process pool (`fit_many(..., workers=N)`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from gpufleet.errors import UserError
from gpufleet.perf.calibration import (
    BOUNDS,
    Calibration,
    calibration_from_dict,
    default_calibration,
    prior_calibration,
)
from gpufleet.validation import fit as fit_module
from gpufleet.validation.fit_space import (
    SHIPPED_SPACE,
    FitSpace,
    from_log,
    inside_bounds,
    moved,
    to_log,
    value_of,
)

# A seeded start moves each fitted constant from its prior by a normal draw of this many
# half log-ranges of its bounds (clipped to them): far enough to reach other basins, near
# enough that most starts stay physical.
SEEDED_SPREAD = 0.5


def start_labels(seeds: int, *, shipped: bool = False) -> list[str]:
    """The starts of one fit, in tie-break order: the prior, the midpoint, the shipped
    constants (in-sample fits only: they were fitted on every row, a held-out one's too),
    then `seeds` seeded perturbations of the prior."""
    return ["prior", "midpoint", *(["shipped"] if shipped else [])] + [
        f"seed{i}" for i in range(1, seeds + 1)
    ]


def start_point(search: fit_module.Search, prior: Calibration, label: str) -> Calibration:
    """The calibration a start named `label` begins from (`prior`: `fit.prepare`'s start)."""
    if label == "prior":
        return prior
    if label == "midpoint":
        return fit_module.midpoint_start(prior, search.knobs)
    if label == "shipped":
        shipped = fit_module.at_prior_where_frozen(
            inside_bounds(default_calibration()), search.space
        )
        return moved(prior, [(k, value_of(shipped, k)) for k in search.knobs])
    if label.startswith("seed") and label[4:].isdigit():
        changes = []
        for knob in search.knobs:
            # One stream per (seed, constant): a constant moves alike in every fold.
            rng = random.Random(f"{label}:{knob[0]}:{knob[1]}")
            lo, hi = BOUNDS[knob[0]]
            half_width = (to_log(knob[0], hi) - to_log(knob[0], lo)) / 2
            x = to_log(knob[0], value_of(prior, knob))
            changes.append(
                (knob, from_log(knob[0], x + rng.gauss(0.0, SEEDED_SPREAD * half_width)))
            )
        return moved(prior, changes)
    raise UserError(f"unknown fit start {label!r} (prior, midpoint, shipped or seed<N>)")


@dataclasses.dataclass(frozen=True)
class StartFit:
    """One start's fit: its label, the training objective it reached (the loss plus the
    ridge's penalty: what the search minimised) and its constants as plain data (a process
    pool pickles them; `Calibration`'s mapping proxies do not)."""

    label: str
    objective: float
    constants: dict[str, Any]

    @property
    def calibration(self) -> Calibration:
        return calibration_from_dict(self.constants)


def _plain(cal: Calibration) -> dict[str, Any]:
    out: dict[str, Any] = {
        f.name: getattr(cal, f.name) for f in dataclasses.fields(cal) if f.name != "backends"
    }
    out["backends"] = {name: dataclasses.asdict(b) for name, b in cal.backends.items()}
    return out


@dataclasses.dataclass(frozen=True)
class FitJob:
    rows: Sequence[Any]
    label: str
    rounds: int = 3
    recipes: bool = False
    loss: str = fit_module.DEFAULT_LOSS
    ridge: float = 0.0
    converge: bool = False  # sweep on until a full cycle accepts nothing (`fit.descend`)
    space: FitSpace = SHIPPED_SPACE  # which engine constants are fitted (`fit_space.FitSpace`)


DEFAULT_SEEDS = 2  # seeded perturbations of the prior per fit, beside the prior and midpoint


@dataclasses.dataclass(frozen=True)
class Refit:
    """How to refit: the search (`rounds`, `loss`, `ridge`, `recipes`, `converge`: sweep on
    until a cycle accepts nothing, `space`: which engine constants it moves), the starts
    (`seeds` perturbations beside the prior and the midpoint) and `workers` processes."""

    rounds: int = 3
    recipes: bool = False
    loss: str = fit_module.DEFAULT_LOSS
    ridge: float = 0.0
    seeds: int = DEFAULT_SEEDS
    workers: int = 1
    converge: bool = False
    space: FitSpace = SHIPPED_SPACE

    def jobs(self, rows: Sequence[Any], *, shipped: bool = False) -> list[FitJob]:
        """One job per start (`start_labels`; `shipped` for in-sample fits only)."""
        return [
            FitJob(
                rows,
                label,
                self.rounds,
                self.recipes,
                self.loss,
                self.ridge,
                self.converge,
                self.space,
            )
            for label in start_labels(self.seeds, shipped=shipped)
        ]


def fit_start(job: FitJob) -> StartFit:
    """One descent from one start on `job.rows` (module-level: a pool's workers call it)."""
    search, prior = fit_module.prepare(
        job.rows, prior_calibration(), recipes=job.recipes, loss=job.loss, ridge=job.ridge,
        space=job.space,
    )  # fmt: skip
    start = start_point(search, prior, job.label)
    steps = fit_module.sweep_steps(job.rounds)
    cal, objective = fit_module.descend(search, start, steps, converge=job.converge)
    return StartFit(job.label, objective, _plain(cal))


def fit_many(jobs: Sequence[FitJob], workers: int = 1) -> list[StartFit]:
    """Every job's fit, in the jobs' order; `workers` > 1 runs them in that many processes."""
    if workers <= 1 or len(jobs) <= 1:
        return [fit_start(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        return list(pool.map(fit_start, jobs))


def best_start(fits: Sequence[StartFit]) -> StartFit:
    """The start with the lowest training objective (the first such on a tie)."""
    return min(fits, key=lambda f: f.objective)
