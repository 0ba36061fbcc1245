"""/metrics with vLLM's names, labels (model_name, engine) and histogram buckets.

Engine gauges and counters are read from `Engine.stats` at scrape time (nothing to update
per step). Latency histograms are filled per token on the hot path, so they use
`gpufleet.stats.Histogram` (one bisect, no lock) instead of prometheus_client's locked one,
and are exposed through the same custom collector.
"""

from __future__ import annotations

import functools
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
from gpufleet.replica.lora import LoraInfo, LoraRequestsGauge
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
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
# vLLM v1's FinishReason values: each is exported from the start (0 until it happens).
FINISH_REASONS = ("stop", "length", "abort", "error")


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


def one_gauge(
    name: str, doc: str, value: float, *, names: list[str], values: list[str]
) -> GaugeMetricFamily:
    """A gauge family with one sample (the replica's own labels)."""
    g = GaugeMetricFamily(name, doc, labels=names)
    g.add_metric(values, value)
    return g


def one_counter(
    name: str, doc: str, value: float, *, names: list[str], values: list[str]
) -> CounterMetricFamily:
    """A counter family with one sample (the replica's own labels)."""
    c = CounterMetricFamily(name, doc, labels=names)
    c.add_metric(values, value)
    return c


class ReplicaMetrics(Collector):
    def __init__(
        self,
        model_name: str,
        stats: Callable[[], SchedulerStats],
        cache_config: dict[str, str],
        engine_index: int = 0,
        max_model_len: int = 8192,
        lora: LoraInfo | None = None,
    ):
        self.model_name = model_name
        # vllm:lora_requests_info, with --enable-lora only (as vLLM)
        self.lora = LoraRequestsGauge(lora) if lora is not None else None
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
        self.max_generation_tokens = Histogram(token_buckets)
        self.params_n = Histogram(PARAMS_N_BUCKETS)
        self.params_max_tokens = Histogram(token_buckets)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def observe_request(self, n: int, max_tokens_param: int | None) -> None:
        """The request's own parameters (vllm:request_params_n, _max_tokens)."""
        self.params_n.observe(n)
        if max_tokens_param:
            self.params_max_tokens.observe(max_tokens_param)

    def observe_max_generation(self, tokens: int) -> None:
        """The longest choice of a finished request (vllm:request_max_num_generation_tokens)."""
        self.max_generation_tokens.observe(tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        names = ["model_name", "engine"]
        labels = self._labels
        gauge = functools.partial(one_gauge, names=names, values=labels)
        counter = functools.partial(one_counter, names=names, values=labels)

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
        # vLLM's pre-0.11 name, still queried by vLLM's example Grafana dashboard
        yield gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage."
            "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
            s.kv_cache_usage,
        )
        sleep = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
            "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
            "sleep level 2.",
            labels=[*names, "sleep_state"],
        )
        for state, value in (("awake", 1.0), ("weights_offloaded", 0.0), ("discard_all", 0.0)):
            sleep.add_metric([*labels, state], value)
        yield sleep
        # No KV connector and no multi-modal cache in the simulated replica: always 0.
        for name, doc in (
            ("vllm:external_prefix_cache_queries",
             "External prefix cache queries from KV connector cross-instance cache sharing, "
             "in terms of number of queried tokens."),
            ("vllm:external_prefix_cache_hits",
             "External prefix cache hits from KV connector cross-instance cache sharing, "
             "in terms of number of cached tokens."),
            ("vllm:mm_cache_queries",
             "Multi-modal cache queries, in terms of number of queried items."),
            ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
        ):  # fmt: skip
            yield counter(name, doc, 0.0)
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
        counts = {reason: 0.0 for reason in FINISH_REASONS}
        counts.update(s.finished_by_reason)
        for reason, count in counts.items():
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
        if self.lora is not None:
            yield self.lora.collect()
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
            ("vllm:request_max_num_generation_tokens",
             "Histogram of maximum number of requested generation tokens.",
             self.max_generation_tokens),
            ("vllm:request_params_n", "Histogram of the n request parameter.", self.params_n),
            ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
             self.params_max_tokens),
            # vLLM's pre-0.11 name for inter-token latency, still queried by its dashboard
            ("vllm:time_per_output_token_seconds",
             "Histogram of time per output token in seconds."
             "DEPRECATED: Use vllm:inter_token_latency_seconds instead.", self.itl),
        ):  # fmt: skip
            h = HistogramMetricFamily(name, doc, labels=names)
            h.add_metric(labels, hist.cumulative(), sum_value=hist.sum)
            yield h
