"""The gateway's autoscaling signals as one typed snapshot.

`FleetState.signals(now_s)` builds it for the live gateway and the simulator alike; the
controller merges it with its actuator's view (`gpufleet.autoscale.gateway_link`). Only the
admin API turns it into JSON (`to_json`), and a controller that reads a gateway over HTTP
turns that JSON back into the same snapshot (`from_json`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.fleet_state.arrivals import Arrivals
from gpufleet.fleet_state.latency import SIGNAL_QUANTILES, LatencyWindows, RecentWindow
from gpufleet.routing.types import ReplicaState, ReplicaView


@dataclass(frozen=True, slots=True)
class LatencyPercentiles:
    """Percentiles over the recent window, in seconds (None: no request in the window)."""

    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None

    @classmethod
    def of(cls, window: RecentWindow, now_s: float) -> LatencyPercentiles:
        p = window.percentiles(now_s, SIGNAL_QUANTILES)
        return cls(p["p50"], p["p90"], p["p99"])

    def to_json(self) -> dict[str, float | None]:
        return {"p50": self.p50_s, "p90": self.p90_s, "p99": self.p99_s}

    @classmethod
    def from_json(cls, raw: object) -> LatencyPercentiles:
        if not isinstance(raw, Mapping):
            return cls()
        return cls(_opt_float(raw.get("p50")), _opt_float(raw.get("p90")),
                   _opt_float(raw.get("p99")))  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelLatency:
    """One model's latencies over the recent window (a model group scales on them)."""

    ttft_s: LatencyPercentiles = LatencyPercentiles()
    tpot_s: LatencyPercentiles = LatencyPercentiles()
    streamed_requests: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"ttft_s": self.ttft_s.to_json(), "tpot_s": self.tpot_s.to_json(),
                "streamed_requests_in_window": self.streamed_requests}  # fmt: skip

    @classmethod
    def from_json(cls, raw: object) -> ModelLatency:
        if not isinstance(raw, Mapping):
            return cls()
        return cls(LatencyPercentiles.from_json(raw.get("ttft_s")),
                   LatencyPercentiles.from_json(raw.get("tpot_s")),
                   int(raw.get("streamed_requests_in_window") or 0))  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """One replica as the gateway sees it: state, its own in-flight count, last scrape."""

    replica_id: str
    url: str = ""
    state: ReplicaState = ReplicaState.READY
    pool: str | None = None
    models: tuple[str, ...] = ()
    in_flight: int = 0
    num_running: int | None = None  # None: not scraped yet
    num_waiting: int | None = None
    kv_cache_usage: float | None = None
    stats_age_s: float | None = None

    @classmethod
    def of(cls, r: ReplicaView, now_s: float) -> ReplicaSnapshot:
        s = r.stats
        return cls(
            replica_id=r.replica_id,
            url=r.url,
            state=r.state,
            pool=r.pool,
            models=tuple(sorted(r.models)),
            in_flight=r.in_flight,
            num_running=s.num_running if s else None,
            num_waiting=s.num_waiting if s else None,
            kv_cache_usage=s.kv_cache_usage if s and s.kv_reported else None,
            stats_age_s=(now_s - s.scraped_at_s) if s else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.replica_id,
            "url": self.url,
            "state": str(self.state),
            "pool": self.pool,
            "models": list(self.models),
            "in_flight": self.in_flight,
            "num_running": self.num_running,
            "num_waiting": self.num_waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "stats_age_s": self.stats_age_s,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ReplicaSnapshot:
        running, waiting = raw.get("num_running"), raw.get("num_waiting")
        return cls(
            replica_id=str(raw.get("id")),
            url=str(raw.get("url") or ""),
            state=_state(raw.get("state")),
            pool=None if raw.get("pool") is None else str(raw["pool"]),
            models=tuple(str(m) for m in raw.get("models") or ()),
            in_flight=int(raw.get("in_flight") or 0),
            num_running=None if running is None else int(running),
            num_waiting=None if waiting is None else int(waiting),
            kv_cache_usage=_opt_float(raw.get("kv_cache_usage")),
            stats_age_s=_opt_float(raw.get("stats_age_s")),
        )


@dataclass(frozen=True, slots=True)
class GatewaySignals:
    """What an autoscaler needs from the gateway at one instant."""

    time_s: float = 0.0
    queue_depth: int = 0  # requests waiting for a ready replica of their model
    queue_depth_by_model: Mapping[str, int] = field(default_factory=dict)
    in_flight_total: int = 0  # requests sent to replicas and not finished
    replicas_by_state: Mapping[str, int] = field(default_factory=dict)
    window_s: float = 0.0
    ttft_s: LatencyPercentiles = LatencyPercentiles()
    tpot_s: LatencyPercentiles = LatencyPercentiles()
    streamed_requests_in_window: int = 0
    replicas: tuple[ReplicaSnapshot, ...] = ()
    latency_by_model: Mapping[str, ModelLatency] = field(default_factory=dict)
    # Requests admitted (routed or queued, not refused): since start, and over the window;
    # the fleet's and each model's. Counts, so that the workers of one gateway add up.
    admitted_total: int = 0
    admitted_in_window: int = 0
    admitted_total_by_model: Mapping[str, int] = field(default_factory=dict)
    admitted_in_window_by_model: Mapping[str, int] = field(default_factory=dict)
    # Mean prompt + output tokens of the requests finished over the window (None: not
    # counted, or a model's view of a fleet serving several: the count is the fleet's).
    tokens_per_request: float | None = None
    # Their mean prompt tokens alone (None: not counted), over the same requests.
    prompt_tokens_per_request: float | None = None

    @property
    def arrival_rate_rps(self) -> float | None:
        """Requests per second admitted over the window (None: no window)."""
        return self.admitted_in_window / self.window_s if self.window_s > 0 else None

    def replica(self, replica_id: str) -> ReplicaSnapshot | None:
        return next((r for r in self.replicas if r.replica_id == replica_id), None)

    def for_model(self, model: str, replica_ids: Collection[str] = ()) -> GatewaySignals:
        """This model's signals alone (a model group's autoscaler reads them): its queue
        depth, its latencies, and the replicas that serve it (or are in `replica_ids`,
        the group's own, whose models the gateway may not know yet)."""
        replicas = tuple(
            r for r in self.replicas if model in r.models or r.replica_id in replica_ids
        )
        by_state = {str(s): 0 for s in ReplicaState}
        for r in replicas:
            by_state[str(r.state)] += 1
        depth = self.queue_depth_by_model.get(model, 0)
        latency = self.latency_by_model.get(model, ModelLatency())
        fleets_own = set(self.latency_by_model) <= {model}  # token counts are the fleet's
        return replace(
            self,
            queue_depth=depth,
            queue_depth_by_model={model: depth} if depth else {},
            in_flight_total=sum(r.in_flight for r in replicas),
            replicas_by_state=by_state,
            ttft_s=latency.ttft_s,
            tpot_s=latency.tpot_s,
            streamed_requests_in_window=latency.streamed_requests,
            replicas=replicas,
            latency_by_model={model: latency},
            admitted_total=self.admitted_total_by_model.get(model, 0),
            admitted_in_window=self.admitted_in_window_by_model.get(model, 0),
            admitted_total_by_model=_only(self.admitted_total_by_model, model),
            admitted_in_window_by_model=_only(self.admitted_in_window_by_model, model),
            tokens_per_request=self.tokens_per_request if fleets_own else None,
            prompt_tokens_per_request=self.prompt_tokens_per_request if fleets_own else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "queue_depth": self.queue_depth,
            "queue_depth_by_model": dict(self.queue_depth_by_model),
            "in_flight_total": self.in_flight_total,
            "replicas_by_state": dict(self.replicas_by_state),
            "window_s": self.window_s,
            "ttft_s": self.ttft_s.to_json(),
            "tpot_s": self.tpot_s.to_json(),
            "streamed_requests_in_window": self.streamed_requests_in_window,
            "replicas": [r.to_json() for r in self.replicas],
            "latency_by_model": {m: v.to_json() for m, v in self.latency_by_model.items()},
            "admitted_total": self.admitted_total,
            "admitted_in_window": self.admitted_in_window,
            "admitted_total_by_model": dict(self.admitted_total_by_model),
            "admitted_in_window_by_model": dict(self.admitted_in_window_by_model),
            "tokens_per_request": self.tokens_per_request,
            "prompt_tokens_per_request": self.prompt_tokens_per_request,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GatewaySignals:
        """The snapshot back from `to_json` (missing fields: their defaults)."""
        by_model = raw.get("queue_depth_by_model") or {}
        by_state = raw.get("replicas_by_state") or {}
        return cls(
            time_s=float(raw.get("time_s") or 0.0),
            queue_depth=int(raw.get("queue_depth") or 0),
            queue_depth_by_model={str(k): int(v) for k, v in by_model.items()},
            in_flight_total=int(raw.get("in_flight_total") or 0),
            replicas_by_state={str(k): int(v) for k, v in by_state.items()},
            window_s=float(raw.get("window_s") or 0.0),
            ttft_s=LatencyPercentiles.from_json(raw.get("ttft_s")),
            tpot_s=LatencyPercentiles.from_json(raw.get("tpot_s")),
            streamed_requests_in_window=int(raw.get("streamed_requests_in_window") or 0),
            replicas=tuple(ReplicaSnapshot.from_json(r) for r in raw.get("replicas") or ()),
            latency_by_model={
                str(m): ModelLatency.from_json(v)
                for m, v in (raw.get("latency_by_model") or {}).items()
            },
            admitted_total=int(raw.get("admitted_total") or 0),
            admitted_in_window=int(raw.get("admitted_in_window") or 0),
            admitted_total_by_model=_counts(raw.get("admitted_total_by_model")),
            admitted_in_window_by_model=_counts(raw.get("admitted_in_window_by_model")),
            tokens_per_request=_opt_float(raw.get("tokens_per_request")),
            prompt_tokens_per_request=_opt_float(raw.get("prompt_tokens_per_request")),
        )


def merge_signals(
    now_s: float, parts: Sequence[GatewaySignals], latency: LatencyWindows
) -> GatewaySignals:
    """Several gateways' signals as one (the workers of one gateway, each with its own
    connections): queue depths and in-flight counts add up; a replica's state is the
    one most of them see (a tie: the one that serves); its scraped engine stats are the
    freshest; latency percentiles are over all their samples (`latency`, the union of
    their windows)."""
    by_id: dict[str, list[ReplicaSnapshot]] = {}
    for part in parts:
        for r in part.replicas:
            by_id.setdefault(r.replica_id, []).append(r)
    replicas = []
    for views in by_id.values():
        votes: dict[ReplicaState, int] = {}
        for v in views:
            votes[v.state] = votes.get(v.state, 0) + 1
        state = max(votes, key=lambda s: (votes[s], s is ReplicaState.READY))
        scraped = [v for v in views if v.stats_age_s is not None]
        fresh = min(scraped, key=lambda v: v.stats_age_s or 0.0) if scraped else views[0]
        replicas.append(replace(fresh, state=state, in_flight=sum(v.in_flight for v in views)))
    by_state = {str(s): 0 for s in ReplicaState}
    for r in replicas:
        by_state[str(r.state)] += 1
    by_model: dict[str, int] = {}
    for part in parts:
        for model, depth in part.queue_depth_by_model.items():
            by_model[model] = by_model.get(model, 0) + depth
    return GatewaySignals(
        time_s=now_s,
        queue_depth=sum(p.queue_depth for p in parts),
        queue_depth_by_model=by_model,
        in_flight_total=sum(p.in_flight_total for p in parts),
        replicas_by_state=by_state,
        replicas=tuple(replicas),
        **_latency_fields(latency, now_s),
        admitted_total=sum(p.admitted_total for p in parts),
        admitted_in_window=sum(p.admitted_in_window for p in parts),
        admitted_total_by_model=_add(p.admitted_total_by_model for p in parts),
        admitted_in_window_by_model=_add(p.admitted_in_window_by_model for p in parts),
    )


def build_signals(
    now_s: float,
    replicas: Iterable[ReplicaView],
    queue_depth_by_model: Mapping[str, int],
    latency: LatencyWindows,
    arrivals: Arrivals | None = None,
) -> GatewaySignals:
    views = list(replicas)
    arrivals = arrivals if arrivals is not None else Arrivals(latency.window_s)
    in_window, in_window_by_model = arrivals.in_window(now_s)
    by_state = {str(s): 0 for s in ReplicaState}
    for r in views:
        by_state[str(r.state)] += 1
    return GatewaySignals(
        time_s=now_s,
        queue_depth=sum(queue_depth_by_model.values()),
        queue_depth_by_model=dict(queue_depth_by_model),
        in_flight_total=sum(r.in_flight for r in views),
        replicas_by_state=by_state,
        replicas=tuple(ReplicaSnapshot.of(r, now_s) for r in views),
        **_latency_fields(latency, now_s),
        admitted_total=arrivals.total,
        admitted_in_window=in_window,
        admitted_total_by_model=dict(arrivals.total_by_model),
        admitted_in_window_by_model=in_window_by_model,
    )


def _latency_fields(latency: LatencyWindows, now_s: float) -> dict[str, Any]:
    """The latency part of a snapshot: the fleet's percentiles and each model's."""
    return {
        "window_s": latency.window_s,
        "ttft_s": LatencyPercentiles.of(latency.ttft, now_s),
        "tpot_s": LatencyPercentiles.of(latency.tpot, now_s),
        "streamed_requests_in_window": latency.ttft.count(),
        "tokens_per_request": latency.tokens.mean(now_s),
        "prompt_tokens_per_request": latency.prompt_tokens.mean(now_s),
        "latency_by_model": {
            model: ModelLatency(
                LatencyPercentiles.of(ttft, now_s), LatencyPercentiles.of(tpot, now_s), ttft.count()
            )
            for model, (ttft, tpot) in latency.by_model.items()
        },
    }


def _only(counts: Mapping[str, int], model: str) -> dict[str, int]:
    return {model: counts[model]} if model in counts else {}


def _add(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for counts in parts:
        for model, n in counts.items():
            out[model] = out.get(model, 0) + n
    return out


def _counts(raw: object) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): int(v) for k, v in raw.items()}


def _opt_float(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float | str):
        return float(value)
    raise ValueError(f"not a number: {value!r}")


def _state(raw: object) -> ReplicaState:
    try:
        return ReplicaState(str(raw))
    except ValueError:
        return ReplicaState.DEAD
