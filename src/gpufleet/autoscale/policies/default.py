"""`default`: gpufleet's own policy, built on what LLM serving needs (DESIGN.md).

- Scale out only on batch saturation: requests waiting (at the gateway, or on one replica
  tick after tick — and past the TTFT SLO when one is set — whose batch is full or with
  half the fleet queueing so: a request between engine steps, or behind a long prefill on
  a replica with room, is not saturation), mean KV-cache usage over a threshold, or TTFT
  or TPOT p90 over its SLO — or when the demand one cold start ahead plus warm headroom
  would exceed what the fleet can batch. Idle batch slots are cheap; a cold start is not.
- That demand, where the gateway counts admissions: the time in the system × the arrival
  rate's peak over the last cold start (Little's law; a trend carried a cold start ahead
  mostly extrapolates noise, and overshot every step ~2×), and no less than the demand
  now while the capacity is a batch size (both lag a steep ramp); else a least-squares
  in-flight trend. With SLOs set, what a replica holds is measured on the fleet (`SloCapacity`: the
  rate it serves within the SLO, as a queue), not taken from the planner, and no replica
  is removed before it has been.
- Replicas starting count as capacity due at their ready time: no second wave for a burst.
- Scale in only when N−1 replicas would have stayed below the saturation thresholds at
  the recent peak (demand and KV, over at least a cold start: the demand the next cold
  start may bring back) and within the latency SLOs at the attainment's quantile (p99
  for 99 %: its p90 may hide the misses; now, and scaled by N/(N−1)), the N replicas
  were not saturated at all during that window, and N−1 also holds the arrival rate's
  line over that window carried a cold start ahead (× the time in the system: replicas
  removed now come back a cold start late, so they must not be needed before then; a
  line that merely slopes up, as one through noise does half the time, is no reason to
  keep them), the check has held for a stabilization window, and no replica is starting;
  then remove as many as the same check (N−k) lets go at once.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gpufleet.autoscale.capacity import SloCapacity
from gpufleet.autoscale.decision import (
    ReplicaBounds,
    ScalingDecision,
    capacity_note,
    check_capacity_per_replica,
)
from gpufleet.autoscale.forecast import LinearTrend, WindowMax
from gpufleet.autoscale.little import LittleDemand
from gpufleet.autoscale.policies.default_scale_in import ScaleIn
from gpufleet.autoscale.policies.saturation import Streak, saturation_reasons, waiting_streaks
from gpufleet.autoscale.signals import FleetSignals, ReplicaSignals
from gpufleet.errors import UserError


@dataclass(slots=True)
class DefaultPolicy:
    bounds: ReplicaBounds = field(default_factory=ReplicaBounds)
    # Sequences one replica batches at once (the plan's concurrent sequences, or
    # max_num_seqs). Lowered automatically when a replica queues requests below it.
    capacity_per_replica: int = 256
    # Where capacity_per_replica came from, in words (shown in every reason).
    capacity_source: str = ""
    kv_usage_threshold: float = 0.9
    ttft_p90_slo_s: float | None = None
    tpot_p90_slo_s: float | None = None
    # The fraction of requests that must meet the SLO: 0.9 sizes the fleet on the
    # window's p90 latency, 0.99 on its p99 (`SloCapacity`).
    slo_attainment: float = 0.9
    measure_capacity: bool = True  # within the SLO, on the fleet (`SloCapacity`), with SLOs
    # Measure it as a token rate (`SloCapacity.in_tokens`). Off: on the Azure study (wave 12)
    # 99.81 % at 49.4 GPU-h against 99.60 % at 42.8 in requests (tokens unweighted).
    capacity_in_tokens: bool = False
    # Or of work, output + this × prompt tokens (`SloCapacity.prompt_token_weight`). Off:
    # wave 13b, the step model's 0.19 on the study: 49.7 GPU-h against 43.2 (docs/up.md).
    prompt_token_weight: float | None = None
    # Without an SLO also size for the in-flight trend a cold start ahead (`expected_demand`).
    # Off: at 120 s cold starts it read a rate step as a ramp (~2×); the demo's 9 s need it.
    # On, scale-in holds the trend's peak forecast while the in-flight line still rises
    # (`DefaultPolicy.trend_hold`: HPA's scale-down stabilization, over the peak window).
    batch_trend: bool = False
    capacity_join_quiet_s: float = 60.0  # `SloCapacity.join_quiet_s` (0: off)
    # Size also for the rate's line a cold start ahead less this many of its standard
    # errors (`LittleDemand.rise_in_flight`; None: off): the recent peak lags a long rise.
    forecast_rise_z: float | None = 3.0  # (both on since wave 17: docs/up.md, the defaults)
    ttft_unloaded_s: float | None = None
    tpot_unloaded_s: float | None = None  # these two: one request alone (the planner's)
    cold_start_s: float = 30.0  # used until the actuator reports observed cold starts
    headroom_fraction: float = 0.1  # warm capacity kept above forecast demand
    # Both stretch to the cold start when it is longer (`_windows`): a trend carried a cold
    # start ahead from a shorter window multiplies its noise by cold start / window.
    trend_window_s: float = 30.0
    peak_window_s: float = 60.0
    scale_in_stabilization_s: float = 30.0  # the N−1 check must hold this long
    scale_in_cooldown_s: float = 30.0  # after any change, before removing a replica
    # Remove as many replicas at once as the N−k check lets go (else one a stabilization
    # window and a cooldown: after the Azure trace's peak, 3–6 too many for minutes).
    scale_in_many: bool = True
    # N−k must also hold the arrival rate's line carried a cold start ahead (where the
    # gateway counts admissions). Off: no scale-in at all while that line slopes up (wave
    # 10's guard): on the Azure study (fixed simulator) 44.8 GPU-hours for 99.64 % of
    # requests, against 42.8 for 99.60 % with it: the guard held surplus replicas for
    # minutes after each peak on slopes that carried the rate up by less than a replica.
    scale_in_ahead: bool = True
    # Lower the capacity only after this many observations (over peak_window_s) of a replica
    # queueing below it: one snapshot can catch a request before the next engine step.
    learn_min_observations: int = 5
    # Waiting requests mean saturation only when the same replica shows them on this many
    # ticks in a row (or the gateway queues on as many): a request that arrived just before
    # the scrape waits for the next engine step (or the next prefill chunk) anyway, and
    # across a large fleet some replica always holds one such request. With a TTFT SLO the
    # queue must also have lasted that long: a shorter one (a burst of long prompts taking
    # a few prefill steps) costs its requests part of their TTFT budget, which the TTFT p90
    # signal weighs, and is gone long before a replica started for it could be ready.
    waiting_ticks: int = 2
    # A forecast alone (nothing saturated) must call for more on this many ticks in a row.
    forecast_ticks: int = 2
    # Cancel starting replicas the demand has not asked for over half a cold start
    # (`ScaleIn.cancel_starts`; Ray Serve stops pending replicas first).
    cancel_idle_starts: bool = True
    name: str = "default"
    _trend: LinearTrend = field(default_factory=LinearTrend)
    _little: LittleDemand = field(default_factory=LittleDemand)
    _slo_capacity: SloCapacity = field(default_factory=SloCapacity)
    _measuring: bool = False  # capacity within the SLO measured (`SloCapacity`)
    _trend_short: LinearTrend = field(default_factory=LinearTrend)
    _peak_demand: WindowMax = field(default_factory=WindowMax)
    _trend_peak: WindowMax = field(default_factory=WindowMax)  # `batch_trend`'s forecasts
    _peak_kv_total: WindowMax = field(default_factory=WindowMax)  # sum of KV fractions
    _saturated_running: deque[tuple[float, int]] = field(default_factory=deque)
    _scale_in: ScaleIn = field(default_factory=ScaleIn)  # its rule and clocks
    _last_saturated_s: float | None = None
    _waiting_streaks: dict[str, Streak] = field(default_factory=dict)  # ready replicas now waiting
    _queue_streak: int = 0
    _forecast_streak: int = 0
    _last_change_s: float | None = None

    def __post_init__(self) -> None:
        check_capacity_per_replica(self.capacity_per_replica)
        if not 0 < self.kv_usage_threshold <= 1:
            raise UserError("must be in (0, 1]", field="kv_usage_threshold", fix="e.g. 0.9")
        if self.headroom_fraction < 0:
            raise UserError("must be ≥ 0", field="headroom_fraction", fix="e.g. 0.1 for 10 %")
        if not 0 < self.slo_attainment < 1:
            raise UserError("must be in (0, 1)", field="slo_attainment", fix="e.g. 0.9 or 0.99")
        self._slo_capacity.ttft_slo_s = self.ttft_p90_slo_s
        self._slo_capacity.tpot_slo_s = self.tpot_p90_slo_s
        self._slo_capacity.quantile = self.slo_attainment
        self._slo_capacity.ttft_unloaded_s = self.ttft_unloaded_s
        self._slo_capacity.tpot_unloaded_s = self.tpot_unloaded_s
        self._slo_capacity.in_tokens = self.capacity_in_tokens
        self._slo_capacity.prompt_token_weight = self.prompt_token_weight
        self._slo_capacity.join_quiet_s = self.capacity_join_quiet_s
        self._windows(self.cold_start_s)

    def _windows(self, cold_start_s: float) -> None:
        trend_s = max(self.trend_window_s, cold_start_s)
        self._trend.window_s = trend_s
        self._trend_short.window_s = trend_s / 3.0
        self._peak_demand.window_s = self._peak_kv_total.window_s = self.peak_s(cold_start_s)
        self._trend_peak.window_s = self.peak_s(cold_start_s)
        # The rate's recent peak covers what the next cold start may bring (`ArrivalRate`).
        self._slo_capacity.smooth_s = self.peak_s(cold_start_s)
        self._little.windows(self.peak_s(cold_start_s))

    def peak_s(self, cold_start_s: float) -> float:
        """The look-back of the N−1 check and of the scale-in guard: at least a cold start."""
        return max(self.peak_window_s, cold_start_s)

    @property
    def capacity(self) -> int:
        """Configured capacity, or less once replicas have shown they batch fewer or
        hold fewer within the SLO (`SloCapacity`)."""
        cap = self.capacity_per_replica
        measured = self.measured_capacity()
        if measured is not None:  # what the replicas hold within the SLO, measured
            # It also bounds the batch: a replica queueing behind long prefills runs fewer
            # sequences at once than it holds within the SLO, and its batch is no capacity.
            return max(1, min(cap, math.floor(measured)))
        seen = [n for _, n in self._saturated_running]
        if len(seen) >= self.learn_min_observations:
            cap = min(cap, max(seen))
        return cap

    def measured_capacity(self) -> float | None:
        """In flight per replica within the SLO, measured (None: no SLO, or not yet): the
        rate a replica serves within it (`SloCapacity`) times the time in the system —
        the same time `expected_demand` multiplies the arrival rate by, so the fleet is
        sized by arrival rate / rate per replica."""
        rps, time_in_system_s = self._slo_capacity.estimate_rps(), self._little.time_in_system_s()
        if not self._measuring or rps is None or time_in_system_s is None:
            return None
        return rps * time_in_system_s

    def _capacity_note(self, cap: int) -> str:
        measured = self.measured_capacity()
        if measured is not None and cap == max(1, math.floor(measured)):
            q = "p99" if self.slo_attainment >= 0.99 else "p90"
            rps = self._slo_capacity.estimate_rps() or 0.0
            work = self._slo_capacity.estimate_work()
            per = f" ({work[0]:.0f} {work[1]})" if work and work[1] != "req/s" else ""
            return (
                f" [measured: {rps:.2f} req/s{per} within the SLO at {q} × "
                f"{measured / rps if rps else 0.0:.1f} s in the system; "
                f"configured {self.capacity_per_replica}]"
            )
        if cap < self.capacity_per_replica:
            return f" [learned; configured {self.capacity_per_replica}]"
        return capacity_note(self.capacity_source)

    def expected_demand(self, now_s: float, demand: int, cold_start_s: float) -> float:
        """Requests in flight to size for one cold start ahead: Little's law where the
        gateway counts admissions (`LittleDemand`; the demand now until a rate's span has
        been seen, and at least the demand now while the capacity is a batch, not
        measured), else the steeper in-flight trend, or the demand now."""
        # `batch_trend`: with no SLO to measure a replica by, the capacity stays a batch,
        # and the in-flight trend carried a cold start ahead sizes for a ramp that the
        # rate's 30 s span lags (wave 18: the demo's 30 s ramp and 9 s cold starts).
        trend = self.forecast(now_s + cold_start_s) if self._batch_trend_on() else None
        if trend is not None:
            self._trend_peak.add(now_s, trend)
        if self._little.known:
            peak = self._little.peak_in_flight()
            if peak is None:
                return max(float(demand), trend or 0.0)
            if self.measured_capacity() is None:
                # A capacity in requests in flight (a batch) is held against the demand
                # now too: the rate's span and the time in the system both lag a steep
                # ramp, and a backlog is in flight that no rate shows. (A measured
                # capacity is a rate × the same time: sized by rates, the demand now is
                # the rate now, which its recent peak already covers.)
                return max(peak, float(demand), trend or 0.0)
            if self.forecast_rise_z is not None:
                rise = self._little.rise_in_flight(now_s + cold_start_s, self.forecast_rise_z)
                return max(peak, rise or 0.0)
            return peak
        forecast = self.forecast(now_s + cold_start_s)
        return max(float(demand), forecast if forecast is not None else 0.0)

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision:
        ready = signals.ready
        current = signals.current_replicas
        demand = signals.demand
        kv_total = sum(r.kv_usage for r in ready)
        cold_start_s = signals.cold_start_s or self.cold_start_s
        self._windows(cold_start_s)
        queueing = self._track_waiting(now_s, signals)
        self._trend.add(now_s, float(demand))
        self._trend_short.add(now_s, float(demand))
        self._peak_demand.add(now_s, float(demand))
        self._peak_kv_total.add(now_s, kv_total)
        self._little.add(now_s, signals)
        self._slo_capacity.add(now_s, signals)
        self._measuring = (
            self.measure_capacity
            and self._little.known
            and signals.latency_requests is not None
            and (self.ttft_p90_slo_s is not None or self.tpot_p90_slo_s is not None)
        )
        self._learn_capacity(now_s)
        cap = self.capacity

        expected = self.expected_demand(now_s, demand, cold_start_s)
        needed = math.ceil(expected * (1.0 + self.headroom_fraction) / cap)
        saturation = self._saturation(signals, queueing)
        if saturation:
            self._last_saturated_s = now_s
        # Starting replicas are capacity arriving at their expected ready time: those due
        # before a replica started now would be count; one due later (a crash in backoff)
        # does not, though it stays in the fleet.
        late = sum(
            1
            for r in signals.starting
            if r.expected_ready_s is not None and r.expected_ready_s > now_s + cold_start_s
        )
        arriving = current - late
        head = (
            f"demand {demand}, forecast {expected:.1f} in {cold_start_s:.0f} s; "
            f"capacity {cap}/replica{self._capacity_note(cap)}; "
            f"{len(ready)} ready + {len(signals.starting)} starting"
            + (f" ({late} due after a new one)" if late else "")
        )

        desired = current  # scale out: saturated now, or one cold start ahead
        self._forecast_streak = self._forecast_streak + 1 if needed > arriving else 0
        needed_now = math.ceil(demand * (1.0 + self.headroom_fraction) / cap)
        confirmed = (
            saturation or needed_now > arriving or self._forecast_streak >= self.forecast_ticks
        )
        if needed > arriving and confirmed:
            desired = needed + late
            why = f"{head}; needs {needed} with {self.headroom_fraction:.0%} headroom"
            if saturation:
                why += f"; saturated: {saturation}"
        elif saturation:
            # Saturated below the assumed capacity (long prompts, KV, a smaller batch): size
            # the step by what the saturated replicas actually run, not by one replica per
            # cold start; replicas already starting still count.
            batched = [r.running for r in queueing if r.running > 0]
            measured = self.measured_capacity() is not None
            # Measured within the SLO, the capacity already says what a replica holds (a
            # batch cut short by long prefills is not less of it): one more replica.
            effective = cap if measured or not batched else max(batched)
            by_observed = math.ceil(expected * (1.0 + self.headroom_fraction) / effective)
            floor = current if len(signals.starting) > late else current + 1
            desired = max(floor, by_observed + late)
            if desired > current:
                why = (
                    f"{head}; saturated: {saturation}; replicas batch {effective} when "
                    f"queueing → needs {max(by_observed, current + 1)}"
                )
            else:
                why = f"{head}; saturated: {saturation}, capacity already starting"
        elif needed > arriving:
            self._scale_in.reset()
            why = (
                f"{head}; forecast needs {needed}, confirming "
                f"({self._forecast_streak}/{self.forecast_ticks} ticks)"
            )
        else:
            desired, why = self._scale_in.decide(self, now_s, signals, cap, cold_start_s, head)

        desired = self.bounds.clamp(desired)
        if desired > current:
            self._scale_in.reset()
        if desired != current:
            self._last_change_s = now_s
        return ScalingDecision(desired, f"{why} → {desired}", self.name, now_s, current)

    def _batch_trend_on(self) -> bool:
        """No capacity is measured within an SLO: none declared (or not measured)."""
        no_slo = self.ttft_p90_slo_s is None and self.tpot_p90_slo_s is None
        return self.batch_trend and (no_slo or not self.measure_capacity)

    def forecast(self, at_s: float) -> float | None:
        """Demand at `at_s` by the steeper of two trends: the full window (steady) and its
        last third (sees a ramp begin)."""
        values = [
            f
            for f in (self._trend.forecast(at_s), self._trend_short.forecast(at_s))
            if f is not None
        ]
        return max(values) if values else None

    def _track_waiting(self, now_s: float, signals: FleetSignals) -> list[ReplicaSignals]:
        """Ready replicas saturated by their queue: waiting requests on waiting_ticks ticks in
        a row, and either a full batch (running ≥ the capacity, or KV over the threshold)
        or at least half the ready replicas queueing so. A minority queueing while their
        batches have room waits behind a long prefill (the step's token budget), not for a
        batch slot; the router sends the next requests elsewhere and a replica more would not
        help. The saturated replicas' batches feed the capacity learned."""
        self._queue_streak = self._queue_streak + 1 if signals.queue_depth > 0 else 0
        streaks, persistent = waiting_streaks(
            now_s, signals, self._waiting_streaks, self.waiting_ticks,
            self.ttft_p90_slo_s or 0.0, self.learn_min_observations,
        )  # fmt: skip
        fleet_wide = 2 * len(persistent) >= len(signals.ready)
        queueing = [
            r
            for r in persistent
            if fleet_wide
            or r.running >= self.capacity_per_replica
            or r.kv_usage >= self.kv_usage_threshold
        ]
        for r in queueing:
            self._saturated_running.extend(streaks[r.replica_id].pending)
            streaks[r.replica_id].pending = []
        self._waiting_streaks = streaks
        return queueing

    def _saturation(self, signals: FleetSignals, queueing: list[ReplicaSignals]) -> str:
        queued = signals.queue_depth > 0 and (
            self._queue_streak >= self.waiting_ticks or not signals.ready
        )
        waiting = sum(r.waiting for r in queueing) + (signals.queue_depth if queued else 0)
        return saturation_reasons(
            signals, waiting, self.kv_usage_threshold, self.ttft_p90_slo_s, self.tpot_p90_slo_s
        )

    def _learn_capacity(self, now_s: float) -> None:
        # A replica that keeps queueing requests while running fewer than we assumed is
        # batching all it can (KV-limited or a smaller max_num_seqs). Believe the largest
        # such batch seen recently, once seen often enough (`_track_waiting` records them).
        window_s = self._peak_demand.window_s
        while self._saturated_running and self._saturated_running[0][0] < now_s - window_s:
            self._saturated_running.popleft()

    def n_minus_k_fits(
        self, now_s: float, signals: FleetSignals, cap: int, cold_start_s: float, k: int
    ) -> tuple[bool, str]:
        """Would N−k ready replicas have held the recent peak (`ScaleIn.n_minus_k_fits`)?"""
        return self._scale_in.n_minus_k_fits(self, now_s, signals, cap, cold_start_s, k)

    # -- what scale-in reads (`default_scale_in.Readings`) ---------------------------------
    def saturated_ago_s(self, now_s: float) -> float | None:
        return None if self._last_saturated_s is None else now_s - self._last_saturated_s

    def changed_ago_s(self, now_s: float) -> float | None:
        return None if self._last_change_s is None else now_s - self._last_change_s

    def awaiting_measurement(self) -> bool:
        """SLOs to measure a replica by, not measured yet."""
        return self._measuring and self.measured_capacity() is None

    def peak_kv_total(self) -> float:
        return self._peak_kv_total.peak()

    def demand_rising(self) -> bool:
        """The arrival rate's line over a cold start slopes up (else the in-flight one's)."""
        if self._little.known:
            return not self.scale_in_ahead and self._little.rate_rising()
        return self._trend.rising()

    def trend_hold(self) -> float | None:
        """With `batch_trend`, the highest in-flight forecast of the peak window while the
        in-flight line over the trend window still slopes up (None otherwise): HPA's scale-down
        stabilization (the highest recommendation of the window) applied to the trend. Its
        forecast, a short line carried a cold start ahead, dips mid-ramp whenever a backlog
        drains; N−k held only against the forecast now removed the replicas it had just
        started, to start them again a cold start later (sim_vs_live: 5 → 3 → 6 around the
        burst). Once the line turns down (the ramp's top passed), the hold lets go, so a burst's
        last forecasts do not keep its fleet through the quiet that follows."""
        if not self._batch_trend_on() or not self._trend.rising():
            return None
        return self._trend_peak.peak()

    def demand_to_hold(
        self, now_s: float, signals: FleetSignals, cold_start_s: float, hold: bool = True
    ) -> tuple[float, str]:
        """The demand fewer replicas must hold, and what it is in words (`hold`: with the
        trend's held peak while the in-flight line rises)."""
        what = "peak"
        if self._little.known:
            worst = self.expected_demand(now_s, signals.demand, cold_start_s)
            # The demand when a replica removed now could be back: the rate's line there.
            ahead = self._little.in_flight_ahead(now_s + cold_start_s)
            if self.scale_in_ahead and ahead is not None and ahead > worst:
                worst, what = ahead, f"rising rate in {cold_start_s:.0f} s"
            held = self.trend_hold() if hold else None
            if held is not None and held > worst:
                worst, what = held, "the trend's peak while demand rises"
        else:
            forecast = self.forecast(now_s + cold_start_s) or 0.0
            worst = max(self._peak_demand.peak(), forecast)
        return worst, what
