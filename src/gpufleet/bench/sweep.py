"""Sweeps: the same run at several loads, and where the knee of the curve lies.

The knee is the highest load the target still keeps up with:
- rate sweeps: the last rate before the first one where achieved request throughput
  falls below 90% of what an unloaded server would give (n requests sent over n/rate
  seconds, plus the lowest rate's median E2E latency to drain), or mean TTFT exceeds 3×
  its value at the lowest rate;
- concurrency sweeps: the last concurrency before the first step whose throughput gain is
  under 20% of the proportional gain (doubling concurrency buys < 20% more throughput).
`find_knee` is pure; `parse_sweep` and `run_sweep` drive it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from gpufleet.bench.config import BenchConfig
from gpufleet.bench.report import BenchReport, SweepReport
from gpufleet.errors import UserError

SWEEP_PARAMS = ("rate", "concurrency")
RATE_KEEPUP_FRACTION = 0.9
TTFT_BLOWUP_FACTOR = 3.0
MIN_MARGINAL_GAIN = 0.2


def parse_sweep(spec: str) -> tuple[str, list[float]]:
    """'rate=2,4,8,16' -> ('rate', [2, 4, 8, 16])."""
    param, sep, values_text = spec.partition("=")
    param = param.strip()
    fix = "e.g. --sweep rate=2,4,8,16 or --sweep concurrency=1,4,16"
    if not sep or param not in SWEEP_PARAMS:
        raise UserError(f"bad sweep {spec!r}", field="--sweep", fix=fix)
    try:
        values = [float(v) for v in values_text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"bad sweep values in {spec!r}", field="--sweep", fix=fix) from None
    if len(values) < 2 or any(v <= 0 for v in values) or values != sorted(values):
        raise UserError(
            "a sweep needs two or more positive values in increasing order",
            field="--sweep",
            fix=fix,
        )
    if param == "concurrency" and any(not v.is_integer() for v in values):
        raise UserError("concurrency values must be integers", field="--sweep", fix=fix)
    return param, values


def find_knee(
    param: str,
    values: Sequence[float],
    throughputs: Sequence[float],
    mean_ttfts_ms: Sequence[float],
    requests: Sequence[int] | None = None,
    drain_s: float = 0.0,
) -> tuple[int | None, str]:
    """Index of the knee (None if none found) and a sentence saying why.

    `requests` (per point) and `drain_s` let a finite rate run's expected throughput
    include the time its last requests take to finish when the server is not loaded.
    """
    n = len(values)
    if n == 0:
        return None, "no points"
    if param == "rate":
        base_ttft = mean_ttfts_ms[0]
        for i in range(n):
            expected = values[i]
            if requests is not None and requests[i] > 0:
                expected = requests[i] / (requests[i] / values[i] + drain_s)
            behind = throughputs[i] < RATE_KEEPUP_FRACTION * expected
            slow = base_ttft > 0 and mean_ttfts_ms[i] > TTFT_BLOWUP_FACTOR * base_ttft
            if behind or slow:
                why = (
                    f"throughput {throughputs[i]:.2f}/s < {RATE_KEEPUP_FRACTION:.0%} of "
                    f"{expected:.2f}/s expected at rate {values[i]:g}"
                    if behind
                    else f"mean TTFT {mean_ttfts_ms[i]:.1f} ms > {TTFT_BLOWUP_FACTOR:g}× {base_ttft:.1f} ms"
                )
                if i == 0:
                    return None, f"saturated already at the lowest rate ({why})"
                return i - 1, f"rate {values[i]:g} is past the knee: {why}"
        return None, "no knee inside the sweep: every rate was served"
    for i in range(1, n):
        prop = values[i] / values[i - 1] - 1.0
        gain = throughputs[i] / throughputs[i - 1] - 1.0 if throughputs[i - 1] > 0 else 0.0
        if prop > 0 and gain < MIN_MARGINAL_GAIN * prop:
            return i - 1, (
                f"concurrency {values[i]:g} bought {gain:.0%} more throughput "
                f"for {prop:.0%} more concurrency"
            )
    return None, "no knee inside the sweep: throughput kept growing"


def point_config(config: BenchConfig, param: str, value: float) -> BenchConfig:
    if param == "rate":
        return dataclasses.replace(config, rate=value, concurrency=None)
    return dataclasses.replace(config, concurrency=int(value))


async def run_sweep(
    config: BenchConfig,
    param: str,
    values: Sequence[float],
    run: Callable[[BenchConfig], Awaitable[BenchReport]],
    should_stop: Callable[[], bool] | None = None,
) -> SweepReport:
    """Run `run(config at value)` at each value, in order, and find the knee.

    When `should_stop()` turns true the sweep ends after the current point (an interrupted
    point is kept: it reports what finished)."""
    reports: list[BenchReport] = []
    for v in values:
        reports.append(await run(point_config(config, param, v)))
        if should_stop is not None and should_stop():
            break
    values = list(values)[: len(reports)]
    knee, why = find_knee(
        param,
        list(values),
        [r.metrics.request_throughput for r in reports],
        [r.metrics.ttft_ms["mean"] for r in reports],
        requests=[r.metrics.completed + r.metrics.failed for r in reports],
        drain_s=reports[0].metrics.e2el_ms["median"] / 1000.0 if reports else 0.0,
    )
    return SweepReport(param, list(values), reports, knee, why)
