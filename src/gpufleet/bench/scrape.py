"""Server-side counters: scrape /metrics before and after a run and report the deltas.

Any counter the target exposes is reported generically (`name{labels}` → increase); the
ones gpufleet understands are also named: vLLM's prefix-cache hits and queries (hence the
hit rate), preemptions, prompt and generation tokens, and the gateway's retries, errors and
ejections and its per-replica counts (`gpufleet_gateway_*` series with a `replica` label).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def parse_counters(text: str) -> dict[SeriesKey, float]:
    """Cumulative series of a Prometheus text page: counters, and histogram/summary count and sum."""
    out: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            cumulative = (
                (family.type == "counter" and name.endswith("_total"))
                or (family.type in ("histogram", "summary") and name.endswith(("_count", "_sum")))
                or (family.type == "unknown" and name.endswith("_total"))
            )
            if cumulative:
                out[(name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def series_name(key: SeriesKey) -> str:
    name, labels = key
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def _sum_named(deltas: dict[SeriesKey, float], name: str) -> float | None:
    values = [v for (n, _), v in deltas.items() if n == name]
    return sum(values) if values else None


@dataclass
class ServerMetricsDelta:
    """What changed on the server during the run (None where the series is absent)."""

    deltas: dict[SeriesKey, float] = field(default_factory=dict)

    @property
    def prefix_cache_hits(self) -> float | None:
        return _sum_named(self.deltas, "vllm:prefix_cache_hits_total")

    @property
    def prefix_cache_queries(self) -> float | None:
        return _sum_named(self.deltas, "vllm:prefix_cache_queries_total")

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        hits, queries = self.prefix_cache_hits, self.prefix_cache_queries
        if hits is None or not queries:
            return None
        return hits / queries

    @property
    def preemptions(self) -> float | None:
        return _sum_named(self.deltas, "vllm:num_preemptions_total")

    @property
    def gateway_retries(self) -> float | None:
        """Requests the gateway retried on another replica (summed over replicas)."""
        return _sum_named(self.deltas, "gpufleet_gateway_replica_retries_total")

    def per_replica(self) -> dict[str, dict[str, float]]:
        """Gateway series by their `replica` label: {replica: {series name: delta}}."""
        out: dict[str, dict[str, float]] = {}
        for (name, labels), value in self.deltas.items():
            if not name.startswith("gpufleet_gateway_"):
                continue
            label_map = dict(labels)
            label_map.pop("target", None)  # which scraped server: here, always the gateway
            replica = label_map.pop("replica", None)
            if replica is None:
                continue
            rest = ",".join(f'{k}="{v}"' for k, v in sorted(label_map.items()))
            series = f"{name}{{{rest}}}" if rest else name
            out.setdefault(replica, {})
            out[replica][series] = out[replica].get(series, 0.0) + value
        return out

    def known(self) -> dict[str, float | None]:
        return {
            "prefix_cache_hits": self.prefix_cache_hits,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "preemptions": self.preemptions,
            "prompt_tokens": _sum_named(self.deltas, "vllm:prompt_tokens_total"),
            "generation_tokens": _sum_named(self.deltas, "vllm:generation_tokens_total"),
            "gateway_retries": self.gateway_retries,
            "gateway_replica_errors": _sum_named(
                self.deltas, "gpufleet_gateway_replica_errors_total"
            ),
            "gateway_ejections": _sum_named(
                self.deltas, "gpufleet_gateway_replica_ejections_total"
            ),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "known": {k: v for k, v in self.known().items() if v is not None},
            "per_replica": self.per_replica(),
            "counter_deltas": {
                series_name(k): v for k, v in sorted(self.deltas.items()) if v != 0.0
            },
        }


def counter_deltas(
    before: dict[SeriesKey, float], after: dict[SeriesKey, float]
) -> ServerMetricsDelta:
    """Increase of every series in `after`; a series that went down was reset, so its delta
    is its new value; one absent before started at 0."""
    deltas: dict[SeriesKey, float] = {}
    for key, value in after.items():
        old = before.get(key, 0.0)
        deltas[key] = value - old if value >= old else value
    return ServerMetricsDelta(deltas)
