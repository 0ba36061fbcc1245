"""When each request (or session) starts, in seconds from the start of the run. Pure.

Open-loop arrivals follow vLLM's serving benchmark: inter-arrival gaps are drawn from a
gamma distribution with shape = burstiness and mean 1/rate (burstiness 1 is a Poisson
process, < 1 burstier, inf a constant rate). For a fixed rate the cumulative times are
rescaled so n requests span exactly n/rate seconds, which steadies throughput across
seeds. A linear ramp moves the rate from its start to its end value across the requests.

A rate schedule (`RatePhase`s: `gpufleet sim --rate-steps`, `gpufleet up --demo`'s quiet,
ramp, burst, quiet) is a rate that changes with time, piecewise linear. Its arrivals are
the same gamma renewal process run in "operational time" Λ(t) = ∫ rate: unit-mean gaps in
Λ are mapped back through Λ⁻¹ (time rescaling), so a constant phase is exactly the process
above and a ramp speeds it up smoothly, with any burstiness.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpufleet.errors import UserError


def _gap_s(rate: float, burstiness: float, rng: random.Random) -> float:
    if math.isinf(rate):
        return 0.0
    if math.isinf(burstiness):
        return 1.0 / rate
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def _check(rate: float, burstiness: float) -> None:
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")


def arrival_offsets(
    n: int,
    rate: float,
    burstiness: float = 1.0,
    rng: random.Random | None = None,
    ramp: tuple[float, float] | None = None,
) -> list[float]:
    """Start offsets of n requests. `ramp` = (start rate, end rate) overrides `rate`."""
    rng = rng or random.Random(0)
    _check(rate if ramp is None else min(ramp), burstiness)
    offsets: list[float] = []
    t = 0.0
    for i in range(n):
        if ramp is not None:
            progress = i / max(n - 1, 1)
            current = ramp[0] + (ramp[1] - ramp[0]) * progress
        else:
            current = rate
        t += _gap_s(current, burstiness, rng)
        offsets.append(t)
    if ramp is None and offsets and offsets[-1] > 0 and not math.isinf(rate):
        scale = (n / rate) / offsets[-1]
        offsets = [x * scale for x in offsets]
    return offsets


def iter_arrival_offsets(
    rate: float, burstiness: float = 1.0, rng: random.Random | None = None
) -> Iterator[float]:
    """Unbounded start offsets at a fixed rate (for timed runs; no rescaling)."""
    rng = rng or random.Random(0)
    _check(rate, burstiness)
    t = 0.0
    while True:
        t += _gap_s(rate, burstiness, rng)
        yield t


@dataclass(frozen=True, slots=True)
class RatePhase:
    """A stretch of a rate schedule: the rate moves linearly from start to end over it."""

    name: str
    duration_s: float
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        if not self.duration_s > 0 or min(self.start_rps, self.end_rps) < 0:
            raise ValueError(f"phase {self.name!r}: duration must be > 0 and rates >= 0")


def total_duration_s(phases: Sequence[RatePhase]) -> float:
    return sum(p.duration_s for p in phases)


def phase_at(phases: Sequence[RatePhase], t_s: float) -> tuple[RatePhase | None, float]:
    """The phase at `t_s` seconds from the start and its request rate then."""
    start = 0.0
    for p in phases:
        if t_s < start + p.duration_s:
            frac = (t_s - start) / p.duration_s
            return p, p.start_rps + (p.end_rps - p.start_rps) * frac
        start += p.duration_s
    return None, 0.0


def _time_in_phase(phase: RatePhase, area: float) -> float:
    """The time into `phase` at which ∫ rate reaches `area` (the inverse of Λ in it)."""
    r0 = phase.start_rps
    a = (phase.end_rps - r0) / (2.0 * phase.duration_s)  # Λ(t) = r0 t + a t²
    # The root of a t² + r0 t - area = 0, in the form that stays exact as a -> 0.
    return 2.0 * area / (r0 + math.sqrt(max(0.0, r0 * r0 + 4.0 * a * area)))


def schedule_offsets(
    phases: Sequence[RatePhase], burstiness: float = 1.0, rng: random.Random | None = None
) -> list[float]:
    """Arrival times over a rate schedule (empty phases send nothing)."""
    rng = rng or random.Random(0)
    _check(1.0, burstiness)
    out: list[float] = []
    t0 = 0.0
    need = _gap_s(1.0, burstiness, rng)  # operational time to the next arrival
    for phase in phases:
        area = phase.duration_s * (phase.start_rps + phase.end_rps) / 2.0
        used = 0.0
        while area > 0 and used + need < area:
            used += need
            out.append(t0 + _time_in_phase(phase, used))
            need = _gap_s(1.0, burstiness, rng)
        need -= area - used
        t0 += phase.duration_s
    return out


def parse_rate_steps(text: str) -> tuple[RatePhase, ...]:
    """'2:60,20:120,2:60' -> a schedule of constant rates (requests/s for seconds)."""
    steps: list[RatePhase] = []
    for i, part in enumerate(text.split(",")):
        rate, sep, secs = part.strip().partition(":")
        try:
            step = RatePhase(f"step {i + 1}", float(secs), float(rate), float(rate))
        except ValueError:
            sep = ""
        if not sep:
            raise UserError(
                f"bad step {part!r}",
                field="--rate-steps",
                fix="RATE:SECONDS pairs separated by commas, e.g. 2:60,20:120,2:60",
            )
        steps.append(step)
    return tuple(steps)
