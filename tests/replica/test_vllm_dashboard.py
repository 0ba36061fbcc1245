"""vLLM's own Grafana dashboard shows data in every panel against a replica.

The panel list (tests/replica/data/vllm_grafana_panels.json) records, for each panel of
vLLM's example dashboard, the metric names its queries read; a panel shows data when at
least one of its queries finds every metric it reads, for the replica's model_name, with
traffic counted where the query rates a counter or histogram.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess

PANELS = json.loads((Path(__file__).parent / "data" / "vllm_grafana_panels.json").read_text())


pytestmark = pytest.mark.process  # starts processes and servers on loopback


def _counted(name: str) -> str | None:
    """The series that must have counted traffic for a rated query to draw a line."""
    if name.endswith("_sum"):
        return name.removesuffix("_sum") + "_count"  # a sum may rightly stay 0 (no queueing)
    return name if name.endswith(("_total", "_count", "_bucket")) else None


async def test_every_vllm_dashboard_panel_has_data(replica: ReplicaProcess) -> None:
    async with aiohttp.ClientSession() as s:
        for i in range(3):
            body = {"model": MODEL, "prompt": f"w{i} " * 40, "max_tokens": 4 + i}
            async with s.post(replica.url + "/v1/completions", json=body) as r:
                assert r.status == 200
        async with s.get(replica.url + "/metrics") as r:
            text = await r.text()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get(PANELS["variable_label"]) == MODEL:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    empty = []
    for panel in PANELS["panels"]:
        shown = [
            q
            for q in panel["queries"]
            if all(name in values for name in q)
            and all(values.get(_counted(n), 0.0) > 0 for n in q if _counted(n))
        ]
        if not shown:
            empty.append(panel["title"])
    assert not empty, f"panels without data: {empty}"
