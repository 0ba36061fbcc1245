"""/metrics with vLLM's names, labels (model_name, engine) and histogram buckets.

Engine gauges and counters are read from `Engine.stats` at scrape time (nothing to update
per step). Latency histograms are filled per token on the hot path, so they use
`gpufleet.stats.Histogram` (one bisect, no lock) instead of prometheus_client's locked one,
and are exposed through the same custom collector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpufleet.engine import SchedulerStats
from gpufleet.stats import Histogram

# vLLM v1's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's buckets for token counts)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


class ReplicaMetrics(Collector):
    def __init__(
        self,
        model_name: str,
        stats: Callable[[], SchedulerStats],
        cache_config: dict[str, str],
        engine_index: int = 0,
        max_model_len: int = 8192,
    ):
        self.model_name = model_name
        self._stats = stats
        self._labels = [model_name, str(engine_index)]
        self._cache_config = dict(cache_config)
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(TOKEN_LATENCY_BUCKETS_S)
        self.tpot = Histogram(TOKEN_LATENCY_BUCKETS_S)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.inference = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.prefill = Histogram(REQUEST_LATENCY_BUCKETS_S)
        self.decode = Histogram(REQUEST_LATENCY_BUCKETS_S)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.prompt_tokens = Histogram(token_buckets)
        self.generation_tokens = Histogram(token_buckets)
        self.iteration_tokens = Histogram(ITERATION_TOKENS_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        names = ["model_name", "engine"]
        labels = self._labels

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(labels, value)
            return c

        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            s.num_running,
        )  # fmt: skip
        yield gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            s.num_waiting,
        )  # fmt: skip
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            s.kv_cache_usage,
        )  # fmt: skip
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries_tokens,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.prefix_cache_hits_tokens,
        )
        yield counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            s.num_preemptions,
        )  # fmt: skip
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.",
            s.generation_tokens,
        )  # fmt: skip
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        for reason, count in s.finished_by_reason.items():
            success.add_metric([*labels, reason], count)
        yield success
        info_keys = sorted(self._cache_config)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*info_keys, "engine", "model_name"],
        )
        info.add_metric([self._cache_config[k] for k in info_keys] + labels[::-1], 1.0)
        yield info
        for name, doc, hist in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             self.ttft),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
             self.itl),
            ("vllm:request_time_per_output_token_seconds",
             "Histogram of time_per_output_token_seconds per request.", self.tpot),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
             self.e2e),
            ("vllm:request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request.", self.queue),
            ("vllm:request_inference_time_seconds",
             "Histogram of time spent in RUNNING phase for request.", self.inference),
            ("vllm:request_prefill_time_seconds",
             "Histogram of time spent in PREFILL phase for request.", self.prefill),
            ("vllm:request_decode_time_seconds",
             "Histogram of time spent in DECODE phase for request.", self.decode),
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
             self.prompt_tokens),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.",
             self.generation_tokens),
            ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
             self.iteration_tokens),
        ):  # fmt: skip
            h = HistogramMetricFamily(name, doc, labels=names)
            h.add_metric(labels, hist.cumulative(), sum_value=hist.sum)
            yield h
