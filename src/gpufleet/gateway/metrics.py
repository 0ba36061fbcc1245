"""The gateway's Prometheus metrics and the recent-window latencies the autoscaler reads.

Per-replica gauges (in-flight, state) are read from the replica table at scrape time, so
the hot path only bumps pre-bound counter and histogram children.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from gpufleet.gateway.replicas import Replica
from gpufleet.gateway.signals import latency_signals

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


class _ReplicaCollector:
    def __init__(self, replicas: Callable[[], Iterable[Replica]], queue_depth: Callable[[], int]):
        self._replicas = replicas
        self._queue_depth = queue_depth

    def collect(self) -> Iterable[GaugeMetricFamily]:
        in_flight = GaugeMetricFamily(
            "gpufleet_gateway_replica_in_flight",
            "Requests the gateway has sent to a replica and not seen finish.",
            labels=["replica"],
        )
        state = GaugeMetricFamily(
            "gpufleet_gateway_replica_state",
            "1 for the replica's current state.",
            labels=["replica", "state"],
        )
        for r in self._replicas():
            in_flight.add_metric([r.replica_id], r.in_flight)
            state.add_metric([r.replica_id, str(r.state)], 1)
        queue = GaugeMetricFamily(
            "gpufleet_gateway_queue_depth",
            "Requests waiting for a ready replica of their model (scale from zero).",
        )
        queue.add_metric([], self._queue_depth())
        yield in_flight
        yield state
        yield queue


class RecentWindow:
    """(time, value) samples of the last `window_s` seconds, bounded in count."""

    def __init__(self, window_s: float, max_samples: int = 20000) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, now_s: float, value: float) -> None:
        self.samples.append((now_s, value))

    def percentiles(self, now_s: float, qs: tuple[float, ...]) -> dict[str, float | None]:
        cutoff = now_s - self.window_s
        while self.samples and self.samples[0][0] < cutoff:
            self.samples.popleft()
        values = sorted(v for _, v in self.samples)
        out: dict[str, float | None] = {}
        for q in qs:
            key = f"p{round(q * 100)}"
            out[key] = values[min(len(values) - 1, int(q * len(values)))] if values else None
        return out

    def count(self) -> int:
        return len(self.samples)


class GatewayMetrics:
    def __init__(
        self,
        replicas: Callable[[], Iterable[Replica]],
        queue_depth: Callable[[], int],
        window_s: float,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.replica_requests = Counter(
            "gpufleet_gateway_replica_requests",
            "Requests sent to a replica (attempts, retries included).",
            ["replica"],
            registry=r,
        )
        self.replica_errors = Counter(
            "gpufleet_gateway_replica_errors",
            "Attempts on a replica that failed (connection, 5xx, broken stream, timeout).",
            ["replica"],
            registry=r,
        )
        self.replica_retries = Counter(
            "gpufleet_gateway_replica_retries",
            "Requests retried on another replica after failing on this one.",
            ["replica"],
            registry=r,
        )
        self.replica_ejections = Counter(
            "gpufleet_gateway_replica_ejections",
            "Times a replica was ejected after consecutive failures.",
            ["replica"],
            registry=r,
        )
        self.requests = Counter(
            "gpufleet_gateway_requests",
            "Client requests answered, by model, tenant and status code.",
            ["model", "tenant", "code"],
            registry=r,
        )
        labels = ["model", "tenant"]
        self.ttft = Histogram(
            "gpufleet_gateway_time_to_first_token_seconds",
            "Gateway-measured time to the first streamed chunk.",
            labels,
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.tpot = Histogram(
            "gpufleet_gateway_time_per_output_token_seconds",
            "Gateway-measured (e2e - ttft) / (chunks - 1) of a streamed request.",
            labels,
            buckets=TOKEN_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            "gpufleet_gateway_inter_token_latency_seconds",
            "Gateway-measured gap between consecutive streamed chunks.",
            labels,
            buckets=TOKEN_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "gpufleet_gateway_e2e_request_latency_seconds",
            "Gateway-measured end-to-end request latency.",
            labels,
            buckets=E2E_BUCKETS_S,
            registry=r,
        )
        r.register(_ReplicaCollector(replicas, queue_depth))
        self.ttft_window = RecentWindow(window_s)
        self.tpot_window = RecentWindow(window_s)
        self._latency_children: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {}
        self._request_children: dict[tuple[str, str, int], Any] = {}

    def bind_replica(self, replica: Replica) -> None:
        rid = replica.replica_id
        replica.m_requests = self.replica_requests.labels(rid)
        replica.m_errors = self.replica_errors.labels(rid)
        replica.m_retries = self.replica_retries.labels(rid)
        replica.m_ejections = self.replica_ejections.labels(rid)

    def latency(self, model: str, tenant: str) -> tuple[Any, Any, Any, Any]:
        """(ttft, tpot, itl, e2e) histogram children for this model and tenant."""
        key = (model, tenant)
        children = self._latency_children.get(key)
        if children is None:
            children = (
                self.ttft.labels(model, tenant),
                self.tpot.labels(model, tenant),
                self.itl.labels(model, tenant),
                self.e2e.labels(model, tenant),
            )
            if len(self._latency_children) < 10000:  # bound label cardinality
                self._latency_children[key] = children
        return children

    def count_request(self, model: str, tenant: str, code: int) -> None:
        key = (model, tenant, code)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(model, tenant, str(code))
            if len(self._request_children) < 10000:
                self._request_children[key] = child
        child.inc()

    def observe_stream(
        self, model: str, tenant: str, ttft_s: float, e2e_s: float, chunks: int, now_s: float
    ) -> None:
        ttft, tpot, _, e2e = self.latency(model, tenant)
        ttft.observe(ttft_s)
        e2e.observe(e2e_s)
        self.ttft_window.add(now_s, ttft_s)
        if chunks > 1:
            tpot_s = (e2e_s - ttft_s) / (chunks - 1)
            tpot.observe(tpot_s)
            self.tpot_window.add(now_s, tpot_s)

    def signals_latency(self, now_s: float | None = None) -> dict[str, Any]:
        now_s = time.monotonic() if now_s is None else now_s
        return latency_signals(now_s, self.ttft_window, self.tpot_window)
