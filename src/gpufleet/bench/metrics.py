"""Serving metrics with the definitions of vLLM's serving benchmark (`vllm bench serve`).

- TTFT: from sending the request to the first stream event that carries a non-empty
  `choices` list (even if its text is empty, e.g. a chat role-only delta).
- ITL: the gaps between consecutive such events.
- E2E latency: from sending to the last such event (the trailing usage event is not a token).
- output tokens: the server's `usage.completion_tokens` (stream_options.include_usage);
  when missing or zero, the generated text counted with the tokenizer.
- TPOT: (E2E − TTFT) / (output_tokens − 1), only for requests with more than one output
  token; for goodput such requests count as TPOT 0.
- goodput: completed requests per second that meet every SLO given (ttft, tpot, e2el, ms).
- throughputs divide by the benchmark's wall duration; failed requests add no tokens.

Pure functions of recorded timelines: no clock, no network.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.bench.records import RequestRecord
from gpufleet.stats import DEFAULT_PERCENTILES, summarize_ms

GOODPUT_KEYS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    ttft_s: float
    itls_s: tuple[float, ...]
    e2e_s: float
    output_tokens: int
    prompt_tokens: int
    tpot_s: float | None  # None when output_tokens <= 1


def word_count(text: str) -> int:
    """The shared tokenizer's count: one token per whitespace word."""
    return len(text.split())


def request_metrics(
    rec: RequestRecord, count_tokens: Callable[[str], int] = word_count
) -> RequestMetrics | None:
    """Metrics of one successful request; None for a failed one."""
    if not rec.ok or not rec.token_times_s:
        return None
    times = rec.token_times_s
    ttft = times[0] - rec.start_s
    e2e = times[-1] - rec.start_s
    itls = tuple(b - a for a, b in itertools.pairwise(times))
    out_tokens = rec.usage_completion_tokens or count_tokens(rec.text)
    tpot = (e2e - ttft) / (out_tokens - 1) if out_tokens > 1 else None
    return RequestMetrics(ttft, itls, e2e, out_tokens, rec.prompt_tokens, tpot)


@dataclass(frozen=True, slots=True)
class FailureClass:
    status: int | None
    error_type: str
    count: int
    example: str


@dataclass(slots=True)
class BenchMetrics:
    """The aggregate of one run, in vLLM's terms (latencies in ms, throughputs per second)."""

    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2el_ms: dict[str, float]
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    failures: list[FailureClass] = field(default_factory=list)
    goodput_slo_ms: dict[str, float] = field(default_factory=dict)

    def flat(self) -> dict[str, Any]:
        """vLLM's result keys: mean_ttft_ms, p99_tpot_ms, request_goodput, ..."""
        out: dict[str, Any] = {
            "duration": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "max_concurrent_requests": self.max_concurrent_requests,
        }
        for name, series in (
            ("ttft", self.ttft_ms),
            ("tpot", self.tpot_ms),
            ("itl", self.itl_ms),
            ("e2el", self.e2el_ms),
        ):
            for stat, value in series.items():
                out[f"{stat}_{name}_ms"] = value
        return out


def is_good(m: RequestMetrics, slo_ms: dict[str, float]) -> bool:
    """Whether a request meets every SLO given (vLLM: value <= SLO; TPOT of ≤1 token is 0)."""
    values = {"ttft": m.ttft_s, "tpot": m.tpot_s or 0.0, "e2el": m.e2e_s}
    return all(values[k] <= slo / 1000.0 for k, slo in slo_ms.items())


def classify_failures(records: Sequence[RequestRecord]) -> list[FailureClass]:
    counts: Counter[tuple[int | None, str]] = Counter()
    examples: dict[tuple[int | None, str], str] = {}
    for r in records:
        if r.ok:
            continue
        key = (r.status, r.error_type or "unknown")
        counts[key] += 1
        examples.setdefault(key, r.error[:300])
    return [
        FailureClass(status, etype, n, examples[(status, etype)])
        for (status, etype), n in counts.most_common()
    ]


def _peaks(ok: Sequence[tuple[RequestRecord, RequestMetrics]]) -> tuple[float, int]:
    """Peak token events in any 1 s bucket, and peak concurrent requests (as vLLM)."""
    if not ok:
        return 0.0, 0
    t0 = min(r.start_s for r, _ in ok)
    t_end = max(r.start_s + m.e2e_s for r, m in ok)
    buckets = [0] * (math.ceil(t_end - t0) + 1)
    events: list[tuple[float, int]] = []
    for r, m in ok:
        for t in r.token_times_s:
            b = int(t - t0)
            if 0 <= b < len(buckets):
                buckets[b] += 1
        events.append((r.start_s, 1))
        events.append((r.start_s + m.e2e_s, -1))
    events.sort()  # at equal times a departure (-1) sorts before an arrival: [start, end)
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return float(max(buckets)), peak


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    goodput_slo_ms: dict[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    count_tokens: Callable[[str], int] = word_count,
) -> BenchMetrics:
    """Aggregate metrics of a run that lasted `duration_s` seconds of wall time."""
    if duration_s <= 0:
        raise ValueError("duration_s must be positive")
    slo = dict(goodput_slo_ms or {})
    for key in slo:
        if key not in GOODPUT_KEYS:
            raise ValueError(f"unknown goodput metric {key!r}; use one of {GOODPUT_KEYS}")
    ok: list[tuple[RequestRecord, RequestMetrics]] = []
    for r in records:
        m = request_metrics(r, count_tokens)
        if m is not None:
            ok.append((r, m))
    ms = [m for _, m in ok]
    ttfts = [m.ttft_s for m in ms]
    tpots = [m.tpot_s for m in ms if m.tpot_s is not None]
    itls = [x for m in ms for x in m.itls_s]
    e2els = [m.e2e_s for m in ms]
    total_in = sum(m.prompt_tokens for m in ms)
    total_out = sum(m.output_tokens for m in ms)
    good = sum(1 for m in ms if is_good(m, slo)) if slo else None
    peak_tokens, peak_conc = _peaks(ok)
    return BenchMetrics(
        duration_s=duration_s,
        completed=len(ms),
        failed=len(records) - len(ms),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ms) / duration_s,
        request_goodput=None if good is None else good / duration_s,
        output_throughput=total_out / duration_s,
        total_token_throughput=(total_in + total_out) / duration_s,
        ttft_ms=summarize_ms(ttfts, percentiles),
        tpot_ms=summarize_ms(tpots, percentiles),
        itl_ms=summarize_ms(itls, percentiles),
        e2el_ms=summarize_ms(e2els, percentiles),
        max_output_tokens_per_s=peak_tokens,
        max_concurrent_requests=peak_conc,
        failures=classify_failures(records),
        goodput_slo_ms=slo,
    )


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """['ttft:500', 'tpot:50'] -> {'ttft': 500.0, 'tpot': 50.0} (milliseconds)."""
    out: dict[str, float] = {}
    for item in items:
        for part in item.split():
            key, sep, value = part.partition(":")
            key = key.strip().lower()
            if not sep or key not in GOODPUT_KEYS:
                raise ValueError(
                    f"bad goodput item {part!r}: expected KEY:MS with KEY one of {GOODPUT_KEYS}"
                )
            try:
                ms = float(value)
            except ValueError:
                raise ValueError(f"bad goodput value in {part!r}: not a number") from None
            if ms < 0:
                raise ValueError(f"goodput SLO {part!r} must be >= 0 ms")
            out[key] = ms
    return out
