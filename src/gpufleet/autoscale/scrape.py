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


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket that holds rank q × count."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower_bound  # the highest finite bound, as Prometheus does
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return lower_bound


def bucket_delta(
    new: list[tuple[float, float]], old: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Buckets of the observations between two scrapes (a restarted replica: all of `new`)."""
    before = dict(old)
    delta = [(le, c - before.get(le, 0.0)) for le, c in new]
    if any(c < 0 for _, c in delta):
        return new
    return delta
