"""Reading vLLM's /metrics text (replicas' own view of their load)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def parse_engine_stats(text: str) -> dict[str, float]:
    """running, waiting and kv_usage (fraction) summed over the engines in one exposition."""
    out = {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
    kv_samples: list[float] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == _RUNNING:
                out["running"] += sample.value
            elif sample.name == _WAITING:
                out["waiting"] += sample.value
            elif sample.name in _KV:
                kv_samples.append(sample.value)
    if kv_samples:
        out["kv_usage"] = max(kv_samples)
    return out


def parse_engine_load(text: str) -> int:
    stats = parse_engine_stats(text)
    return int(stats["running"] + stats["waiting"])


def parse_histogram(text: str, name: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) buckets of histogram `name`, summed over label sets."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                le = float(sample.labels.get("le", "inf"))
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return sorted(buckets.items())
