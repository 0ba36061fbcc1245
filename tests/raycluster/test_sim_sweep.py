"""`gpufleet sim --sweep … --ray-address`: one scenario per Ray task, the same table."""

from __future__ import annotations

import pytest

from gpufleet.sim.report import comparison_row
from gpufleet.sim.scenario import Scenario, run_many

from .conftest import RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.process, pytest.mark.timeout(300)]


def test_sweep_on_ray_matches_local_processes(ray_cluster: RayCluster) -> None:
    from gpufleet.sim.ray_sweep import run_many_on_ray

    base = Scenario(rate=8.0, duration_s=20.0, input_tokens=256, output_tokens=32, seed=7,
                    replicas=2)  # fmt: skip
    scenarios = [
        base.with_field("routing", r).with_field("name", f"routing={r}")
        for r in ("round_robin", "least_outstanding", "power_of_two")
    ]
    on_ray = run_many_on_ray(scenarios, ray_cluster.address)
    local = run_many(scenarios, workers=2)
    rows = [comparison_row(s["scenario"], s) for s in on_ray]
    assert rows == [comparison_row(s["scenario"], s) for s in local]
    assert [r["scenario"] for r in rows] == [s.name for s in scenarios]
    assert all(r["completed"] > 0 for r in rows)
