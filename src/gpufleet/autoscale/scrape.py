"""Reading histograms from vLLM's /metrics text (load and KV: `gpufleet.fleet_state`)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def parse_histogram(text: str, name: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) buckets of histogram `name`, summed over label sets."""
    bucket = f"{name}_bucket"
    # Only its bucket lines reach the parser: a replica exposes hundreds of lines, and
    # parsing them all took ~10 ms per replica in the gateway's event loop (`gpufleet up`
    # reads every replica's TTFT this way every 2 s), a stall for every stream it relays.
    lines = [ln for ln in text.splitlines() if ln.startswith(bucket)]
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name == bucket:
                le = float(sample.labels.get("le", "inf"))
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return sorted(buckets.items())
