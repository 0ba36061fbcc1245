"""Each engine's names for the load and KV signals the fleet reads from its `/metrics`.

One `EngineMetricNames` per engine family; `parse_engine_metrics` (engine_metrics.py) reads
whichever family a replica's text carries, or the one its config names. To read another
engine, add its names here; nothing else changes.

- vLLM: both metric generations. V0 (≤ 0.7) and early V1 called KV usage
  `vllm:gpu_cache_usage_perc`; 0.9+ exports `vllm:kv_cache_usage_perc` (and, until 0.11,
  the old name too, deprecated). The first name present wins: the two are one signal and
  are never added. V0's swapped requests (`vllm:num_requests_swapped`) wait in the engine
  like its waiting ones, so they count as waiting.
- SGLang (`--enable-metrics`): `sglang:num_running_reqs`, `sglang:num_queue_reqs` (plus
  the grammar queue), `sglang:token_usage` (a fraction of the KV token pool) and the pool
  size `sglang:max_total_num_tokens`; data-parallel ranks are told apart by `dp_rank`.
- TGI: `tgi_batch_current_size` (running) and `tgi_queue_size` (waiting); no KV gauge.
- trtllm-serve: its Prometheus text at `/prometheus/metrics` carries
  `trtllm_num_requests_running` / `_waiting` and `trtllm_kv_cache_utilization` in recent
  releases; older ones only histograms there, and iteration statistics as JSON at
  `/metrics` (read by engine_metrics.py as well).
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vllm", "sglang", "tgi", "trtllm")


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """One engine family's names for the signals the fleet reads."""

    engine: str  # "vllm", "sglang", "tgi", "trtllm"
    running: tuple[str, ...]  # gauges of requests in the batch (disjoint sets: summed)
    waiting: tuple[str, ...]  # gauges of requests queued in the engine (summed)
    kv_usage: tuple[str, ...] = ()  # fraction 0..1 per engine; the first name present wins
    # KV capacity: an info gauge whose labels give blocks and block size (vLLM), ...
    cache_info: str | None = None
    info_blocks_label: str = "num_gpu_blocks"
    info_block_size_label: str = "block_size"
    # ... a gauge whose value is the pool size in tokens (SGLang), or blocks x block size.
    capacity_tokens: tuple[str, ...] = ()
    capacity_blocks: tuple[str, str] | None = None  # (blocks gauge, tokens-per-block gauge)
    # Labels that tell one engine of a replica from another (data-parallel ranks). Series
    # of one engine that differ only in other labels (SGLang's tp_rank / pp_rank) are the
    # same scheduler seen by several ranks: they count once.
    engine_labels: tuple[str, ...] = ()
    # Where the engine serves them, in the order to try.
    metrics_paths: tuple[str, ...] = ("/metrics",)
    # How to get load metrics from an engine that exposes none (said in the gateway's log).
    enable_hint: str = ""

    @property
    def load_names(self) -> tuple[str, ...]:
        return (*self.running, *self.waiting)

    @property
    def names(self) -> tuple[str, ...]:
        info = (self.cache_info,) if self.cache_info else ()
        blocks = self.capacity_blocks or ()
        return (*self.load_names, *self.kv_usage, *info, *self.capacity_tokens, *blocks)


VLLM = EngineMetricNames(
    engine="vllm",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting", "vllm:num_requests_swapped"),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    cache_info="vllm:cache_config_info",
    engine_labels=("engine",),
    enable_hint="vLLM serves them at /metrics unless started with --disable-log-stats",
)
SGLANG = EngineMetricNames(
    engine="sglang",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs", "sglang:num_grammar_queue_reqs"),
    kv_usage=("sglang:token_usage",),
    cache_info="sglang:cache_config_info",
    info_blocks_label="num_pages",
    info_block_size_label="page_size",
    capacity_tokens=("sglang:max_total_num_tokens",),
    engine_labels=("dp_rank",),
    enable_hint="start SGLang with --enable-metrics",
)
TGI = EngineMetricNames(
    engine="tgi",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
)
TRTLLM = EngineMetricNames(
    engine="trtllm",
    running=("trtllm_num_requests_running",),
    waiting=("trtllm_num_requests_waiting",),
    kv_usage=("trtllm_kv_cache_utilization",),
    capacity_blocks=("trtllm_kv_cache_max_blocks", "trtllm_kv_cache_tokens_per_block"),
    metrics_paths=("/prometheus/metrics", "/metrics"),
    enable_hint="set enable_iter_perf_stats: true in trtllm-serve's --extra_llm_api_options "
    "(iteration stats at /metrics), or run a release with trtllm_num_requests_* gauges",
)
ENGINE_METRICS: tuple[EngineMetricNames, ...] = (VLLM, SGLANG, TGI, TRTLLM)
BY_ENGINE: dict[str, EngineMetricNames] = {f.engine: f for f in ENGINE_METRICS}


def metric_names(engine: str) -> EngineMetricNames:
    """The family of `engine`; KeyError names the known ones."""
    try:
        return BY_ENGINE[engine]
    except KeyError:
        raise KeyError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}") from None
