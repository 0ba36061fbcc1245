"""`gpufleet sim --config FILE`: replica groups, tenants and failures from YAML, with
errors that name the field; and a seed that fixes such a run in any process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.errors import UserError
from gpufleet.sim.fleet_spec import load_sim_fleet, validate_sim_fleet
from gpufleet.sim.scenario import Scenario, build_config

FLEET_YAML = """
groups:
  - {name: h100, gpu: h100-sxm, replicas: 2, autoscale: true}
  - {name: a100, gpu: a100-80gb, tp: 2, replicas: 1, pool: gold, startup_s: 45, gpu_price: 1.5}
tenants:
  - {name: acme, share: 1, pool: gold, max_concurrency: 8}
  - {name: free, share: 3, requests_per_s: 15, burst: 20, policy: round_robin}
failures: {mtbf_s: 20, restart: true}
max_attempts: 2
"""
SMALL = ["sim", "--rate", "30", "--num-requests", "300", "--input-tokens", "300",
         "--output-tokens", "40", "--seed", "5"]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"groups": [{"name": "a", "gpus": "h100"}]}, "groups.0.gpus"),
        ({"groups": [{"name": "a", "tp": 0}]}, "groups.0.tp"),
        ({"groups": [{"name": "a"}, {"name": "a"}]}, "groups"),
        ({"groups": [{"name": "a", "autoscale": True}, {"name": "b", "autoscale": True}]},
         "groups[].autoscale"),
        ({"tenants": [{"name": "t", "share": 0}]}, "tenants.0.share"),
        ({"tenants": [{"name": "t", "share": 1, "pool": "gold"}]}, "tenants.0.pool"),
        ({"failures": {"mtbf_s": -1}}, "failures.mtbf_s"),
        ({"failure": {"mtbf_s": 10}}, "failure"),
        ([1, 2], "--config"),
    ],
)  # fmt: skip
def test_bad_config_names_the_field(data: object, field: str) -> None:
    with pytest.raises(UserError) as info:
        validate_sim_fleet(data)
    assert info.value.field == field


def test_layout_errors_name_the_group_and_autoscaling_needs_a_group(tmp_path: Path) -> None:
    bad = validate_sim_fleet({"groups": [{"name": "a", "quant": "fp3"}]})
    with pytest.raises(UserError) as info:
        build_config(Scenario(rate=1.0, num_requests=1, fleet=bad))
    assert info.value.field == "groups.0.quant"
    fixed = validate_sim_fleet({"groups": [{"name": "a"}]})
    with pytest.raises(UserError, match="autoscale"):
        build_config(Scenario(rate=1.0, num_requests=1, fleet=fixed, autoscale="hpa"))
    path = tmp_path / "f.yaml"
    path.write_text("groups: [")
    with pytest.raises(UserError, match="not valid YAML"):
        load_sim_fleet(path)


def test_groups_take_their_layouts_cold_starts_and_prices(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_YAML)
    cfg = build_config(Scenario(rate=1.0, num_requests=1, fleet=load_sim_fleet(path),
                                autoscale="default", startup_s=30.0))  # fmt: skip
    h100, a100 = cfg.replica_groups()
    assert (h100.gpus_per_replica, h100.startup_s, h100.autoscaled) == (1, 30.0, True)
    assert (a100.gpus_per_replica, a100.startup_s, a100.pool) == (2, 45.0, "gold")
    assert a100.price_per_gpu_hour_usd == 1.5 and h100.price_per_gpu_hour_usd > 1.5
    assert a100.engine.num_gpu_blocks != h100.engine.num_gpu_blocks
    assert cfg.max_attempts == 2 and cfg.faults is not None and cfg.faults.mtbf_s == 20
    assert [t.name for t in cfg.tenants] == ["acme", "free"]
    assert cfg.tenants[1].routing is not None and cfg.tenants[1].routing.name == "round_robin"


def test_a_production_fleet_runs_and_reports_groups_tenants_and_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, out = tmp_path / "fleet.yaml", tmp_path / "run.json"
    path.write_text(FLEET_YAML)
    args = [*SMALL, "--config", str(path), "--autoscale", "default", "--max-replicas", "5",
            "--startup-s", "5", "--json", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["gpufleet", *args])
    main()
    text = capsys.readouterr().out
    assert "group h100:" in text and "tenant acme:" in text and "Replica crashes" in text
    d = json.loads(out.read_text())
    assert d["completed"] + d["failed"] == 300
    assert set(d["groups"]) == {"h100", "a100"} and set(d["tenants"]) == {"acme", "free"}
    assert d["crashes"] > 0 and d["gpu_hours"] > 0 and d["cost_usd"] > 0
    assert d["failures"].get("rate_limited", 0) > 0


@pytest.mark.process
def test_a_seed_fixes_a_production_run_across_processes(tmp_path: Path) -> None:
    """Tenants, crashes, retries and autoscaling: the same figures whatever the
    string-hash salt of the process (PYTHONHASHSEED)."""
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_YAML)
    args = [*SMALL, "--config", str(path), "--autoscale", "default", "--max-replicas", "5",
            "--startup-s", "5", "--policy", "prefix_aware", "--prefix-groups", "4",
            "--prefix-tokens", "256"]  # fmt: skip
    figures = []
    for salt in ("1", "2"):
        out = tmp_path / f"run{salt}.json"
        r = subprocess.run(
            [sys.executable, "-c", "from gpufleet.cli import main; main()", *args,
             "--json", str(out)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": salt},
            check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        d = json.loads(out.read_text())
        figures.append({k: v for k, v in d.items() if not k.startswith("sim_")})
    assert figures[0] == figures[1]
    assert figures[0]["crashes"] > 0 and figures[0]["scaling_changes"]
