"""The gateway's Prometheus metrics; streamed requests also feed the fleet core's recent
latency windows, which the autoscaler reads.

The hot path only bumps plain Python numbers (`Count.inc`, `Histogram.observe`: no lock,
no label lookup); one collector turns them into Prometheus families when /metrics is read.
A gateway is one event loop, so nothing here is shared across threads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from gpufleet.fleet_state import LatencyWindows
from gpufleet.gateway.replicas import Replica
from gpufleet.stats import Histogram

# Bucket edges in seconds, like vLLM's request-level histograms.
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TOKEN_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
E2E_BUCKETS_S = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)


class Count:
    """A counter the hot path bumps without a lock (one event loop)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


_HISTOGRAMS = (
    ("gpufleet_gateway_time_to_first_token_seconds",
     "Gateway-measured time to the first streamed chunk.", TTFT_BUCKETS_S),
    ("gpufleet_gateway_time_per_output_token_seconds",
     "Gateway-measured (e2e - ttft) / (events - 1) of a streamed request.", TOKEN_BUCKETS_S),
    ("gpufleet_gateway_inter_token_latency_seconds",
     "Gateway-measured gap between consecutive streamed chunks.", TOKEN_BUCKETS_S),
    ("gpufleet_gateway_e2e_request_latency_seconds",
     "Gateway-measured end-to-end request latency.", E2E_BUCKETS_S),
)  # fmt: skip
_REPLICA_COUNTERS = (
    ("gpufleet_gateway_replica_requests", "m_requests",
     "Requests sent to a replica (attempts, retries included)."),
    ("gpufleet_gateway_replica_errors", "m_errors",
     "Attempts on a replica that failed (connection, 5xx, broken stream, timeout)."),
    ("gpufleet_gateway_replica_retries", "m_retries",
     "Requests retried on another replica after failing on this one."),
    ("gpufleet_gateway_replica_ejections", "m_ejections",
     "Times a replica was ejected after consecutive failures."),
)  # fmt: skip
_MAX_SERIES = 10000  # bound label cardinality (models x tenants x codes)


class GatewayMetrics:
    def __init__(
        self,
        replicas: Callable[[], Iterable[Replica]],
        queue_depth: Callable[[], int],
        windows: LatencyWindows,
        queue_depth_by_model: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._replicas = replicas
        self._queue_depth = queue_depth
        self._queue_depth_by_model = queue_depth_by_model
        # Replicas removed from the table keep their counters in the exposition.
        self._gone: dict[str, Replica] = {}
        self._latency: dict[tuple[str, str], tuple[Histogram, ...]] = {}
        self._requests: dict[tuple[str, str, str], Count] = {}
        # mid-stream failover, by model (and why the stream broke)
        self._resumes: dict[tuple[str, str], Count] = {}
        self._resumed_tokens: dict[str, Count] = {}
        self._resume_failures: dict[str, Count] = {}
        self.windows = windows
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def bind_replica(self, replica: Replica) -> None:
        replica.m_requests = Count()
        replica.m_errors = Count()
        replica.m_retries = Count()
        replica.m_ejections = Count()

    def forget_replica(self, replica: Replica) -> None:
        """Keep a removed replica's counters (Prometheus counters never go back)."""
        if len(self._gone) < _MAX_SERIES:
            self._gone[replica.replica_id] = replica

    def latency(self, model: str, tenant: str) -> tuple[Histogram, ...]:
        """(ttft, tpot, itl, e2e) histograms for this model and tenant."""
        if not model.isascii():
            model = _label(model)
        key = (model, tenant)
        hists = self._latency.get(key)
        if hists is None:
            hists = tuple(Histogram(bounds) for _, _, bounds in _HISTOGRAMS)
            if len(self._latency) < _MAX_SERIES:
                self._latency[key] = hists
        return hists

    def count_request(self, model: str, tenant: str, code: int) -> None:
        if not model.isascii():
            model = _label(model)
        key = (model, tenant, str(code))
        count = self._requests.get(key)
        if count is None:
            count = Count()
            if len(self._requests) < _MAX_SERIES:
                self._requests[key] = count
        count.inc()

    def count_resume(self, model: str, kind: str, tokens: int) -> None:
        """A request resumed on another replica after `kind` broke it, with `tokens`
        already sent to its client (re-sent to the engine as prompt)."""
        model = model if model.isascii() else _label(model)
        _bump(self._resumes, (model, kind))
        _bump(self._resumed_tokens, model, tokens)

    def count_resume_failure(self, model: str) -> None:
        """A broken request that could not be resumed (the client got an error event)."""
        _bump(self._resume_failures, model if model.isascii() else _label(model))

    def observe_stream(
        self,
        model: str,
        tenant: str,
        ttft_s: float,
        e2e_s: float,
        chunks: int,
        now_s: float,
        usage: tuple[int, int] | None = None,
    ) -> None:
        """One streamed answer; `usage`: its (prompt, completion) tokens where the stream
        reported them (the gateway does not tokenize)."""
        ttft, tpot, _, e2e = self.latency(model, tenant)
        ttft.observe(ttft_s)
        e2e.observe(e2e_s)
        tpot_s = None
        if chunks > 1:
            tpot_s = (e2e_s - ttft_s) / (chunks - 1)
            tpot.observe(tpot_s)
        # Without usage no token count: `tokens_per_request` stays unknown and a capacity
        # in tokens or work holds its last mix (or stays in requests).
        tokens, prompt = (sum(usage), usage[0]) if usage is not None else (None, None)
        self.windows.observe(now_s, ttft_s, tpot_s, model, tokens, prompt)

    # -- exposition (prometheus_client calls this on every /metrics read) ----------------
    def collect(self) -> Iterator[Any]:
        live = list(self._replicas())
        every = {r.replica_id: r for r in (*self._gone.values(), *live)}
        for name, attr, doc in _REPLICA_COUNTERS:
            fam = CounterMetricFamily(name, doc, labels=["replica"])
            for rid, r in every.items():
                fam.add_metric([rid], getattr(r, attr).value)
            yield fam
        in_flight = GaugeMetricFamily(
            "gpufleet_gateway_replica_in_flight",
            "Requests the gateway has sent to a replica and not seen finish.",
            labels=["replica"],
        )
        state = GaugeMetricFamily(
            "gpufleet_gateway_replica_state", "1 for the replica's current state.",
            labels=["replica", "state"],
        )  # fmt: skip
        for r in live:
            in_flight.add_metric([r.replica_id], r.in_flight)
            state.add_metric([r.replica_id, str(r.state)], 1)
        yield in_flight
        yield state
        loads = CounterMetricFamily(
            "gpufleet_gateway_replica_lora_loads",
            "LoRA adapters the gateway loaded onto a replica (dynamic-LoRA API).",
            labels=["replica"],
        )
        for rid, r in every.items():
            loads.add_metric([rid], r.adapter_loads)
        yield loads
        queue = GaugeMetricFamily(
            "gpufleet_gateway_queue_depth",
            "Requests waiting for a ready replica of their model (scale from zero).",
        )
        queue.add_metric([], self._queue_depth())
        yield queue
        # One series per model: a model group's autoscaler (KEDA, an HPA) scales on its own.
        by_model = GaugeMetricFamily(
            "gpufleet_gateway_queue_depth_by_model",
            "Requests waiting for a ready replica, by the model they asked for.",
            labels=["model"],
        )
        for model, depth in self._queue_depth_by_model().items():
            by_model.add_metric([model if model.isascii() else _label(model)], depth)
        yield by_model
        requests = CounterMetricFamily(
            "gpufleet_gateway_requests",
            "Client requests answered, by model, tenant and status code.",
            labels=["model", "tenant", "code"],
        )
        for (model, tenant, code), count in self._requests.items():
            requests.add_metric([model, tenant, code], count.value)
        yield requests
        yield _counter("gpufleet_gateway_resumes",
                       "Requests resumed on another replica after a failure mid-answer, "
                       "by what broke them (reset, eof, stall, engine_error, non_streamed).",
                       ["model", "reason"], self._resumes)  # fmt: skip
        yield _counter("gpufleet_gateway_resumed_tokens",
                       "Tokens already sent to clients when their requests were resumed.",
                       ["model"], {(m,): c for m, c in self._resumed_tokens.items()})  # fmt: skip
        yield _counter("gpufleet_gateway_resume_failures",
                       "Broken requests the gateway could not resume (error event sent).",
                       ["model"], {(m,): c for m, c in self._resume_failures.items()})  # fmt: skip
        for i, (name, doc, _) in enumerate(_HISTOGRAMS):
            hfam = HistogramMetricFamily(name, doc, labels=["model", "tenant"])
            for (model, tenant), hists in self._latency.items():
                h = hists[i]
                hfam.add_metric([model, tenant], h.cumulative(), h.sum)
            yield hfam


def _bump(table: dict[Any, Count], key: Any, amount: float = 1.0) -> None:
    count = table.get(key)
    if count is None:
        count = Count()
        if len(table) < _MAX_SERIES:
            table[key] = count
    count.inc(amount)


def _counter(
    name: str, doc: str, labels: list[str], counts: dict[Any, Count]
) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=labels)
    for key, count in counts.items():
        fam.add_metric(list(key), count.value)
    return fam


def _label(text: str) -> str:
    """A label value the exposition can encode (a lone surrogate from a client's model name
    would otherwise break /metrics for good)."""
    return text.encode("utf-8", "replace").decode("utf-8")
