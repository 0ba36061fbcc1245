"""The one reader of an engine's `/metrics`: load and KV signals as `ScrapedMetrics`.

The gateway applies it to every replica it scrapes, the local actuator to a draining
replica, and the simulator builds the same `ScrapedMetrics` from its engine, so every
consumer reads a replica's load the same way.

Engines name their gauges differently; each family of names is one `EngineMetricNames`
in `ENGINE_METRICS`. To read another engine (SGLang, TGI, TRT-LLM), add its names there;
nothing else changes.

Combining the engines of one replica (vLLM with data parallelism exposes one label set per
engine, `engine="0"`, `engine="1"`, ...):

- running and waiting requests are **summed**: each request sits in exactly one engine.
- KV usage is the **capacity-weighted mean** of the engines' fractions, i.e. the share of
  the replica's KV blocks in use (`KV_USAGE_RULE`). A sum exceeds 1 as soon as two engines
  are half full; a max calls a replica full while its API server would still place a new
  request on a less loaded engine. Weights are the engines' `num_gpu_blocks` from the info
  metric; engines that do not report it weigh as much as the mean of those that do (all
  equally when none does).
- KV capacity in tokens is the sum over engines of `num_gpu_blocks x block_size`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.fleet_state.lora_metrics import (
    LORA_REQUESTS_INFO,
    LoraRequestsInfo,
    lora_requests_info,
)

KV_USAGE_RULE = "capacity-weighted mean over the replica's engines"


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """One engine family's names for the signals the fleet reads."""

    engine: str  # "vllm", ...
    running: tuple[str, ...]  # gauges of requests in the batch
    waiting: tuple[str, ...]  # gauges of requests queued in the engine
    kv_usage: tuple[str, ...]  # fraction 0..1 per engine; the first name present wins
    cache_info: str | None = None  # info gauge with num_gpu_blocks and block_size labels
    # Labels that tell one engine of a replica from another (data-parallel ranks).
    engine_labels: tuple[str, ...] = ("engine",)

    @property
    def names(self) -> tuple[str, ...]:
        info = (self.cache_info,) if self.cache_info else ()
        return (*self.running, *self.waiting, *self.kv_usage, *info)


# vLLM V1 names; V0 called KV usage gpu_cache_usage_perc.
VLLM = EngineMetricNames(
    engine="vllm",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    cache_info="vllm:cache_config_info",
)
ENGINE_METRICS: tuple[EngineMetricNames, ...] = (VLLM,)
_PREFIXES = (*(name for family in ENGINE_METRICS for name in family.names), LORA_REQUESTS_INFO)


@dataclass(frozen=True, slots=True)
class ScrapedMetrics:
    """A replica's load as its /metrics told it (zeros when it exposes none of the names)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction 0..1 of the replica's KV blocks in use
    kv_capacity_tokens: int | None = None  # None: the engine does not report it
    engine: str | None = None  # which family of names matched; None: none did
    lora: LoraRequestsInfo | None = None  # vllm:lora_requests_info, when it exposes it

    @property
    def load(self) -> int:
        """Requests the engine holds: running plus waiting."""
        return self.num_running + self.num_waiting


def parse_engine_metrics(text: str) -> ScrapedMetrics:
    """Read one replica's Prometheus exposition. Raises ValueError on text that does not
    parse. Only the lines with a known name reach the parser (replicas expose hundreds)."""
    lines = [ln for ln in text.splitlines() if ln.startswith(_PREFIXES)]
    samples: list[tuple[str, dict[str, str], float]] = []
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            samples.append((sample.name, sample.labels, sample.value))
    present = {name for name, _, _ in samples}
    lora = lora_requests_info(samples) if LORA_REQUESTS_INFO in present else None
    for names in ENGINE_METRICS:
        if present.intersection(names.names):
            return replace(_combine(names, samples), lora=lora)
    return ScrapedMetrics(lora=lora)


def _combine(
    names: EngineMetricNames, samples: list[tuple[str, dict[str, str], float]]
) -> ScrapedMetrics:
    running = waiting = 0.0
    usage_by_name: dict[str, dict[tuple[str, ...], float]] = {}
    blocks: dict[tuple[str, ...], int] = {}
    capacity_tokens = 0
    for name, labels, value in samples:
        if name in names.running:
            running += value
        elif name in names.waiting:
            waiting += value
        elif name in names.kv_usage:
            usage_by_name.setdefault(name, {})[_engine_key(names, labels)] = value
        elif name == names.cache_info:
            try:
                n_blocks = int(labels["num_gpu_blocks"])
                block_size = int(labels["block_size"])
            except (KeyError, ValueError):
                continue
            key = _engine_key(names, labels)
            if key not in blocks:  # an engine counts once, however many info lines
                blocks[key] = n_blocks
                capacity_tokens += n_blocks * block_size
    usage = next((usage_by_name[n] for n in names.kv_usage if n in usage_by_name), {})
    return ScrapedMetrics(
        num_running=int(running),
        num_waiting=int(waiting),
        kv_cache_usage=weighted_kv_usage(usage, blocks),
        kv_capacity_tokens=capacity_tokens or None,
        engine=names.engine,
    )


def _engine_key(names: EngineMetricNames, labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(labels.get(label, "") for label in names.engine_labels)


def weighted_kv_usage(
    usage: dict[tuple[str, ...], float], blocks: dict[tuple[str, ...], int]
) -> float:
    """KV_USAGE_RULE: the engines' usage fractions weighted by their KV blocks."""
    if not usage:
        return 0.0
    known = [blocks[k] for k in usage if blocks.get(k)]
    default = sum(known) / len(known) if known else 1.0
    total = sum(blocks.get(k) or default for k in usage)
    return sum(u * (blocks.get(k) or default) for k, u in usage.items()) / total
