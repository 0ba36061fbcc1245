"""The one reader of an engine's `/metrics`: load and KV signals as `ScrapedMetrics`.

The gateway applies it to every replica it scrapes, the local actuator to a draining
replica, and the simulator builds the same `ScrapedMetrics` from its engine, so every
consumer reads a replica's load the same way. Each engine's names are in engine_names.py
(vLLM V0 and V1, SGLang, TGI, trtllm-serve); trtllm-serve's JSON iteration statistics are
read here too.

Combining the engines of one replica (vLLM with data parallelism exposes one label set per
engine, `engine="0"`, `engine="1"`, ...; SGLang one per `dp_rank`):

- running and waiting requests are **summed**: each request sits in exactly one engine.
- KV usage is the **capacity-weighted mean** of the engines' fractions, i.e. the share of
  the replica's KV cache in use (`KV_USAGE_RULE`). A sum exceeds 1 as soon as two engines
  are half full; a max calls a replica full while its API server would still place a new
  request on a less loaded engine. Weights are the engines' KV capacities in tokens;
  engines that do not report one weigh as much as the mean of those that do (all equally
  when none does).
- KV capacity in tokens is the sum over engines.

A replica whose text carries none of its engine's load gauges reports no load
(`load_reported` False): the fleet then routes it by the gateway's in-flight counts alone
rather than reading it as idle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.fleet_state.engine_names import ENGINE_METRICS, EngineMetricNames, metric_names
from gpufleet.fleet_state.lora_metrics import (
    LORA_REQUESTS_INFO,
    LoraRequestsInfo,
    lora_requests_info,
)

KV_USAGE_RULE = "capacity-weighted mean over the replica's engines"
_PREFIXES = tuple(
    sorted({name for family in ENGINE_METRICS for name in family.names} | {LORA_REQUESTS_INFO})
)

Key = tuple[str, ...]  # one engine of a replica (its data-parallel rank labels)


@dataclass(frozen=True, slots=True, init=False)  # (`__init__` below: compiled)
class ScrapedMetrics:
    """A replica's load as its /metrics told it."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float | None = 0.0  # fraction 0..1 of the replica's KV; None: not exported
    kv_capacity_tokens: int | None = None  # None: the engine does not report it
    engine: str | None = None  # which family of names matched; None: none did
    load_reported: bool = True  # False: no running/waiting gauge (route by in-flight counts)
    lora: LoraRequestsInfo | None = None  # vllm:lora_requests_info, when it exposes it

    def __init__(
        self,
        num_running: int = 0,
        num_waiting: int = 0,
        kv_cache_usage: float | None = 0.0,
        kv_capacity_tokens: int | None = None,
        engine: str | None = None,
        load_reported: bool = True,
        lora: LoraRequestsInfo | None = None,
    ) -> None:
        # The frozen dataclass's own `__init__`, written out: mypyc leaves a generated one
        # interpreted (mypyc/mypyc#817), ~13,500 instructions a scrape in the simulator.
        setattr_ = object.__setattr__
        setattr_(self, "num_running", num_running)
        setattr_(self, "num_waiting", num_waiting)
        setattr_(self, "kv_cache_usage", kv_cache_usage)
        setattr_(self, "kv_capacity_tokens", kv_capacity_tokens)
        setattr_(self, "engine", engine)
        setattr_(self, "load_reported", load_reported)
        setattr_(self, "lora", lora)

    @classmethod
    def no_load(cls, engine: str | None = None) -> ScrapedMetrics:
        """What a text without load gauges says: nothing (not zero) about the load."""
        return cls(kv_cache_usage=None, engine=engine, load_reported=False)

    @property
    def load(self) -> int:
        """Requests the engine holds: running plus waiting."""
        return self.num_running + self.num_waiting


def parse_engine_metrics(text: str, engine: str | None = None) -> ScrapedMetrics:
    """Read one replica's metrics text: Prometheus exposition, or trtllm-serve's JSON
    iteration statistics. `engine` (vllm, sglang, tgi, trtllm) reads only that family's
    names; None takes the first family the text carries. Raises ValueError on text that
    does not parse (and KeyError on an unknown `engine`)."""
    families = (metric_names(engine),) if engine is not None else ENGINE_METRICS
    if text.lstrip().startswith("["):
        if engine not in (None, "trtllm"):
            return ScrapedMetrics.no_load(engine)
        return parse_iteration_stats(text)
    # Only the lines with a known name reach the parser (replicas expose hundreds).
    lines = [ln for ln in text.splitlines() if ln.startswith(_PREFIXES)]
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if math.isfinite(sample.value):
                samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    lora = None
    if LORA_REQUESTS_INFO in samples:
        lora = lora_requests_info((LORA_REQUESTS_INFO, labels, value)
                                  for labels, value in samples[LORA_REQUESTS_INFO])  # fmt: skip
    for names in families:
        if any(name in samples for name in names.names):
            return replace(_combine(names, samples), lora=lora)
    return replace(ScrapedMetrics.no_load(engine), lora=lora)


def _combine(
    names: EngineMetricNames, samples: Mapping[str, list[tuple[dict[str, str], float]]]
) -> ScrapedMetrics:
    def per_engine(name: str) -> dict[Key, float]:
        out: dict[Key, float] = {}
        for labels, value in samples.get(name, ()):
            key = tuple(labels.get(label, "") for label in names.engine_labels)
            out[key] = max(out.get(key, value), value)  # ranks of one engine count once
        return out

    def total(metric: Iterable[str]) -> float:
        return sum(sum(per_engine(n).values()) for n in metric)

    load_reported = any(n in samples for n in names.load_names)
    usage_name = next((n for n in names.kv_usage if n in samples), None)
    usage = per_engine(usage_name) if usage_name else None
    capacity = _capacity_tokens(names, samples, per_engine)
    return ScrapedMetrics(
        num_running=int(total(names.running)),
        num_waiting=int(total(names.waiting)),
        kv_cache_usage=weighted_kv_usage(usage, capacity) if usage is not None else None,
        kv_capacity_tokens=int(sum(capacity.values())) or None,
        engine=names.engine,
        load_reported=load_reported,
    )


def _capacity_tokens(
    names: EngineMetricNames,
    samples: Mapping[str, list[tuple[dict[str, str], float]]],
    per_engine: Callable[[str], dict[Key, float]],
) -> dict[Key, float]:
    """KV capacity in tokens per engine, from whichever form the engine reports it."""
    capacity: dict[Key, float] = {}
    if names.cache_info:
        for labels, _ in samples.get(names.cache_info, ()):
            try:
                blocks = int(labels[names.info_blocks_label])
                block_size = int(labels[names.info_block_size_label])
            except (KeyError, ValueError):
                continue
            key = tuple(labels.get(label, "") for label in names.engine_labels)
            capacity.setdefault(key, float(blocks * block_size))  # one engine counts once
    for name in names.capacity_tokens:
        for key, tokens in per_engine(name).items():
            capacity.setdefault(key, tokens)
    if names.capacity_blocks is not None:
        max_blocks, per_block = (per_engine(n) for n in names.capacity_blocks)
        for key, n in max_blocks.items():
            if key in per_block:
                capacity.setdefault(key, n * per_block[key])
    return {k: v for k, v in capacity.items() if v > 0}


def weighted_kv_usage(usage: Mapping[Key, float], capacity: Mapping[Key, float]) -> float:
    """KV_USAGE_RULE: the engines' usage fractions weighted by their KV capacities."""
    if not usage:
        return 0.0
    known = [capacity[k] for k in usage if capacity.get(k)]
    default = sum(known) / len(known) if known else 1.0
    total = sum(capacity.get(k) or default for k in usage)
    return sum(u * (capacity.get(k) or default) for k, u in usage.items()) / total


def parse_iteration_stats(text: str) -> ScrapedMetrics:
    """trtllm-serve's `/metrics` JSON (a list of per-iteration statistics, drained on each
    read): the latest iteration's active and queued requests and KV blocks. An empty list
    (no iteration since the last read, or statistics not enabled) says nothing."""
    try:
        stats = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON iteration statistics: {e}") from None
    if not isinstance(stats, list):
        raise ValueError("iteration statistics must be a JSON list")
    last = next((s for s in reversed(stats) if isinstance(s, dict)), None)
    if last is None or "numActiveRequests" not in last:
        return ScrapedMetrics.no_load("trtllm")
    kv = last.get("kvCacheStats") or {}
    max_blocks = _number(kv.get("maxNumBlocks"))
    used = _number(kv.get("usedNumBlocks"))
    per_block = _number(kv.get("tokensPerBlock"))
    return ScrapedMetrics(
        num_running=int(_number(last.get("numActiveRequests"))),
        num_waiting=int(_number(last.get("numQueuedRequests"))),
        kv_cache_usage=used / max_blocks if max_blocks > 0 else None,
        kv_capacity_tokens=int(max_blocks * per_block) or None,
        engine="trtllm",
    )


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value)
