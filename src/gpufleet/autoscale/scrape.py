"""Reading histograms from vLLM's /metrics text (load and KV: `gpufleet.fleet_state`)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def parse_histogram(text: str, name: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) buckets of histogram `name`, summed over label sets."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                le = float(sample.labels.get("le", "inf"))
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return sorted(buckets.items())
