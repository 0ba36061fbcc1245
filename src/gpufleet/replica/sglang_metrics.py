"""/metrics with SGLang's names and labels (`gpufleet replica --engine sglang`).

SGLang's scheduler metrics (python/sglang/srt/metrics/collector.py): gauges of running and
queued requests, the token pool's usage and size, the prefix cache hit rate and the
generation throughput; counters of tokens and requests; latency histograms. Labels as a
0.5 server sets them: model_name, engine_type ("unified": no prefill/decode split),
tp_rank, pp_rank. The same engine statistics and latency histograms as the vLLM
personality feed them (`ReplicaMetrics`), so both personalities report one engine alike.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

from prometheus_client.core import (
    HistogramMetricFamily,
    Metric,
)

from gpufleet.replica.metrics import ReplicaMetrics, one_counter, one_gauge

LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank"]


class SglangMetrics(ReplicaMetrics):
    """ReplicaMetrics rendered under SGLang's names."""

    _last_gen: tuple[float, int] | None = None  # (wall time, generation tokens) at last read

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        labels = [self.model_name, "unified", "0", "0"]
        pool_tokens = s.num_gpu_blocks * s.block_size

        gauge = functools.partial(one_gauge, names=LABELS, values=labels)
        counter = functools.partial(one_counter, names=LABELS, values=labels)

        yield gauge("sglang:num_running_reqs", "The number of running requests.", s.num_running)
        yield gauge("sglang:num_used_tokens", "The number of used tokens.",
                    round(s.kv_cache_usage * pool_tokens))  # fmt: skip
        yield gauge("sglang:token_usage", "The token usage.", s.kv_cache_usage)
        yield gauge("sglang:gen_throughput", "The generation throughput (token/s).",
                    self._gen_throughput(s.generation_tokens))  # fmt: skip
        yield gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
                    s.num_waiting)  # fmt: skip
        yield gauge("sglang:num_grammar_queue_reqs",
                    "The number of requests in the grammar waiting queue.", 0)  # fmt: skip
        hit_rate = (
            s.prefix_cache_hits_tokens / s.prefix_cache_queries_tokens
            if s.prefix_cache_queries_tokens
            else 0.0
        )
        yield gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hit_rate)
        yield gauge("sglang:max_total_num_tokens",
                    "Maximum total number of tokens in the KV cache pool.", pool_tokens)  # fmt: skip
        yield gauge("sglang:num_retracted_reqs", "The number of retracted requests.", 0)
        yield counter("sglang:prompt_tokens", "Number of prefill tokens processed.",
                      s.prompt_tokens)  # fmt: skip
        yield counter("sglang:generation_tokens", "Number of generation tokens processed.",
                      s.generation_tokens)  # fmt: skip
        yield counter("sglang:cached_tokens", "Number of cached prompt tokens.",
                      s.prefix_cache_hits_tokens)  # fmt: skip
        yield counter("sglang:num_requests", "Number of requests processed.",
                      sum(s.finished_by_reason.values()))  # fmt: skip
        yield counter("sglang:num_retracted_requests", "Total number of retracted requests.",
                      s.num_preemptions)  # fmt: skip
        for name, doc, hist in (
            ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             self.ttft),
            ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
             self.itl),
            ("sglang:time_per_output_token_seconds",
             "Histogram of time per output token in seconds.", self.tpot),
            ("sglang:e2e_request_latency_seconds",
             "Histogram of End-to-end request latency in seconds", self.e2e),
            ("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", self.queue),
            ("sglang:prompt_tokens_histogram", "Histogram of prompt token length.",
             self.prompt_tokens),
            ("sglang:generation_tokens_histogram", "Histogram of generation token length.",
             self.generation_tokens),
        ):  # fmt: skip
            h = HistogramMetricFamily(name, doc, labels=LABELS)
            h.add_metric(labels, hist.cumulative(), sum_value=hist.sum)
            yield h

    def _gen_throughput(self, generation_tokens: int) -> float:
        """Tokens per second since the previous read (SGLang logs it per interval)."""
        now = time.monotonic()
        last, self._last_gen = self._last_gen, (now, generation_tokens)
        if last is None or now <= last[0]:
            return 0.0
        return (generation_tokens - last[1]) / (now - last[0])
