"""What one replica serves within the latency SLO, measured on the fleet itself.

A planner's capacity (requests in flight whose *mean* TTFT and TPOT meet the SLO, for a
closed batch) is optimistic for an open arrival stream: prompts' prefill chunks share
steps with decodes, and a request that must meet the SLO is judged at the tail (p90 of a
window, or 99 % of requests), not the mean. So the policy measures it where it runs, as
a rate (requests per second per ready replica: the arrival rate is the fleet's input;
the in-flight count is its output and grows with every queue).

A replica is a queue: its latency stays near its unloaded value q0 at low load and turns
up steeply near its capacity, q ≈ q0 / (1 − ρ) with ρ the utilisation (M/M/1, and a
processor-sharing batch). One window at rate λ with latency q gives ρ = 1 − q0 / q, and
the SLO's utilisation is ρ* = 1 − q0 / SLO, so the rate within the SLO is

    μ*  ≈  λ × ρ* / ρ  =  λ × (1 − q0 / SLO) / (1 − q0 / q)

q0 is the lowest latency (at the SLO's quantile) seen over a long span: a tail's floor
is the tail of the requests themselves (a p99 TTFT is the prefill of a p99 prompt), not
one mean request alone, which the planner's unloaded latency (where given) is and q0
never goes below. Not so for TPOT, from below: a decode step's time does not depend on the
request it serves, so TPOT's tail alone is the planner's unloaded TPOT, and a window within
the SLO is read from there (`add`). A q0 taken too low only makes μ* err towards λ (for a window within
the SLO: "at least the rate it served"); one too high (a fleet never seen at a light
load) errs high, which the windows over the SLO then bound (over it μ* < λ always). Far below the knee q − q0 is small and noisy,
so a window within the SLO only bounds μ* from below, at most 1.5 × the rate it saw; a
window over it bounds μ* from above; the estimate moves only when a bound (the median
over the smoothing span) crosses it, so a fleet over-provisioned for a while does not
forget what it learned under load.

With `in_tokens`, where the gateway counts the tokens of the requests it sees finish
(`FleetSignals.tokens_per_request`), the rate is one of work (prompt + output tokens per
second), read back in requests per second at the current mix: in requests per second
what a replica holds swings with the mix (on the Azure conversation trace the fewest
replicas that hold each minute serve 5.2 to 9.7 requests per second each, 7 to 10.5
thousand tokens: `benchmarks/results/autoscale_oracle.json`). Off by default: an
unweighted sum misses that a decode token costs a replica more than a prompt token (~2.5
× on that trace, where output-heavy minutes hold ~7 thousand tokens a replica and
prompt-heavy ones ~9.5), and the default policy on it held 99.81 % of requests for 0.97
× the static fleet's GPU-hours, against 99.60 % at 0.84 × in requests (wave 12; on the
trace tiled 8 times, 41.0 GPU-hours against 38.1). Per replica of the fewest that hold
each minute, requests per second stay within 10 % of their mean in 43 of its 58 minutes,
tokens per second in 30: the steadier unit on that trace.

With `prompt_token_weight` w, where the gateway counts the prompt tokens apart
(`FleetSignals.prompt_tokens_per_request`), a request's work is its output tokens + w ×
its prompt tokens: w is a prompt token's cost on a replica in output tokens' (prefill
time per prompt token over decode time per output token at the batch a replica holds,
from the step-time model), so a mix that turns output-heavy raises the need at once
instead of after the windows over the SLO. Pure: samples come in with their timestamps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpufleet.autoscale.forecast import ArrivalRate, WindowMean, WindowMedian, WindowMin
from gpufleet.autoscale.signals import FleetSignals, Percentiles


def quantile_of(p: Percentiles, quantile: float) -> float:
    """The window's latency at the SLO's quantile (p90, or p99 for ≥ 99 % of requests)."""
    return p.p99_s if quantile >= 0.99 else p.p90_s


@dataclass(slots=True)
class SloCapacity:
    """Requests per second one ready replica serves within the SLO, from the fleet's own
    arrival rate and latency."""

    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    quantile: float = 0.9  # of requests that must meet the SLO
    window_s: float = 60.0  # the gateway's latency window: the rate is counted over the same
    smooth_s: float = 120.0  # median of the per-tick estimates over this long
    min_requests: int = 50  # a window with fewer requests says little about its tail
    max_extrapolation: float = 1.5  # a window within the SLO: at most this × its rate
    floor_span_s: float = 1800.0  # q0: the lowest latency over this long
    ttft_unloaded_s: float | None = None  # q0 from the planner, where known
    tpot_unloaded_s: float | None = None
    # Measure a token rate where the gateway counts tokens (else requests per second).
    in_tokens: bool = False
    # Measure a rate of work where the gateway counts prompt and output tokens apart: a
    # request's work is its output tokens + this × its prompt tokens (a prompt token's
    # cost on a replica in output tokens', from the step-time model). None: off.
    prompt_token_weight: float | None = None
    # No bound from above within this long of a replica becoming ready (0: off): a window
    # over the SLO then may be the router's herd onto it, not what a replica holds
    # (docs/up.md, Wave 16; measured in Wave 17: the default policy sets it to 60 s).
    join_quiet_s: float = 0.0
    _ready_ids: frozenset[str] = frozenset()  # the ready replicas at the last tick
    _joined_s: float = -math.inf
    _rate: ArrivalRate = field(default_factory=ArrivalRate)
    _ready: WindowMean = field(default_factory=WindowMean)
    _since_s: float | None = None
    _lower: WindowMedian = field(default_factory=WindowMedian)  # windows within the SLO
    _upper: WindowMedian = field(default_factory=WindowMedian)  # windows over it
    _estimate: float | None = None
    _floor: dict[str, WindowMin] = field(default_factory=dict)  # q0 per SLO (TTFT, TPOT)
    # Tokens per request now (None: the rate is in requests), and whether the bounds are
    # token rates: fixed by the first sample, so that the units never mix.
    _work: float | None = None
    _in_work: bool | None = None

    def add(self, now_s: float, signals: FleetSignals) -> None:
        if signals.admitted_total is None:
            return
        window_s = signals.window_s or self.window_s
        self._rate.rate_s = self._ready.window_s = window_s
        self._lower.window_s = self._upper.window_s = self.smooth_s
        self._rate.add(now_s, float(signals.admitted_total))
        self._ready.add(now_s, float(len(signals.ready)))
        # A replica joined: one ready now that was not at the last tick (by id, so that
        # one leaving as another joins in the same tick counts; a count did not).
        ready_ids = frozenset(r.replica_id for r in signals.ready)
        if ready_ids - self._ready_ids:
            self._joined_s = now_s
        self._ready_ids = ready_ids
        if self._since_s is None:
            self._since_s = now_s
        work = self._work_of(signals)
        if work is not None and work > 0:
            self._work = work
        requests = signals.latency_requests
        if requests is None or requests < self.min_requests:
            return  # a tail over few (or an unknown number of) requests says little
        if now_s - self._since_s < window_s:
            return  # the load has not been seen over the whole latency window yet
        rate, ready = self._rate.rate(), self._ready.mean()
        if not rate or not ready:
            return
        lower_factors, upper_factors, within = [], [], True
        for name, slo, p, unloaded in (
            ("ttft", self.ttft_slo_s, signals.ttft_s, self.ttft_unloaded_s),
            ("tpot", self.tpot_slo_s, signals.tpot_s, self.tpot_unloaded_s),
        ):
            if slo is None or p is None or quantile_of(p, self.quantile) <= 0:
                continue
            q = quantile_of(p, self.quantile)
            floor = self._floor.setdefault(name, WindowMin())
            floor.window_s = self.floor_span_s
            floor.add(now_s, q)
            # From below, the tail's own floor; from above, the planner's one request
            # alone where given (a floor seen only under load would make a window just
            # over the SLO look like a collapse).
            seen = min(max(floor.low(), unloaded or 0.0), slo * 0.999)
            alone = min(unloaded, seen) if unloaded is not None else seen
            # From below, TPOT starts from one request alone too: a decode step's time is
            # the weights' read plus the batch's KV, whichever request it serves, so its
            # tail alone is its mean alone, and what the lightest window showed above that
            # was load already (prefill chunks sharing steps). Taken as q0, that floor read
            # a window near it as an idle fleet (ρ ≈ 0) and bounded the rate at 1.5 × what
            # it served: 11.1 req/s a replica on the Azure trace, where 8 replicas at 7.5
            # each missed the TPOT SLO. TTFT's tail alone is the tail prompt's prefill: q0
            # stays the floor seen.
            lower_factors.append(_queue_factor(alone if name == "tpot" else seen, q, slo))
            upper_factors.append(_queue_factor(alone, q, slo))
            within = within and q <= slo
        if not lower_factors:
            return
        if self._in_work is None:
            self._in_work = self._work is not None
        per_replica = rate / ready * self._work_per_request()
        if within:
            factor = min(min(lower_factors), self.max_extrapolation)
            self._lower.add(now_s, per_replica * factor)
        elif not signals.starting and now_s - self._joined_s >= self.join_quiet_s:
            # Over the SLO while replicas are starting: the fleet is short and already
            # growing; the window says so, not what a replica holds.
            self._upper.add(now_s, per_replica * min(upper_factors))
        self._lower.expire(now_s)
        self._upper.expire(now_s)  # a bound from above lasts its span, then lapses
        lower, upper = self._lower.median(), self._upper.median()
        est = self._estimate
        if lower is not None:
            est = lower if est is None else max(est, lower)
        if upper is not None:
            est = upper if est is None else min(est, upper)
        self._estimate = est

    def _work_of(self, signals: FleetSignals) -> float | None:
        """A request's mean work now, in the estimate's unit (None: not counted): its
        tokens, or output + weight × prompt tokens."""
        tokens, prompt, weight = (
            signals.tokens_per_request,
            signals.prompt_tokens_per_request,
            self.prompt_token_weight,
        )
        if tokens is None:
            return None
        if weight is not None:
            return None if prompt is None else (tokens - prompt) + weight * prompt
        return tokens if self.in_tokens else None

    def _work_per_request(self) -> float:
        """A request's work in the estimate's unit: its tokens, or one request."""
        return (self._work or 1.0) if self._in_work else 1.0

    def estimate_rps(self) -> float | None:
        """Requests per second per replica within the SLO at the current mix (None: not
        measured yet)."""
        return None if self._estimate is None else self._estimate / self._work_per_request()

    def estimate_work(self) -> tuple[float, str] | None:
        """The estimate in its own unit: (rate, "tokens/s", "work/s" or "req/s")."""
        if self._estimate is None:
            return None
        if not self._in_work:
            return self._estimate, "req/s"
        return self._estimate, "tokens/s" if self.prompt_token_weight is None else "work/s"


def _queue_factor(q0: float, q: float, slo: float) -> float:
    """ρ* / ρ for a queue whose latency is q0 / (1 − ρ): the rate within the SLO over
    the rate that showed latency q."""
    return (1.0 - q0 / slo) / max(1.0 - q0 / q, 1e-9)
