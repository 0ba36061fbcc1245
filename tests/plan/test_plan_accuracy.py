"""benchmarks/plan_accuracy.py on a small slice of the measured CSV (no timing asserts)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.errors import UserError
from gpufleet.plan.perf_validation import DEFAULT_CSV, read_rows

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "plan_accuracy.py"
CONFIGS = ROOT / "src" / "gpufleet" / "specs" / "data" / "models"

pytestmark = pytest.mark.skipif(not DEFAULT_CSV.exists(), reason="shared validation CSV absent")


def _subset(tmp_path: Path) -> Path:
    with DEFAULT_CSV.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    picked: list[dict[str, str]] = []
    for model in ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-8B-Instruct"):
        picked += [r for r in rows if r["model_path"] == model][:4]
    odd = dict(picked[0], id="row-on-unknown-gpu", system="tpu_v9")
    out = tmp_path / "subset.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows([*picked, odd])
    return out


def test_benchmark_reports_errors_per_group_and_names_unmodelled_rows(tmp_path: Path) -> None:
    out_json = tmp_path / "acc.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(_subset(tmp_path)),
            "--model-configs",
            str(CONFIGS),
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out_json.read_text())
    assert report["rows_total"] == 9
    assert report["overall"]["rows"] == 8
    assert report["unmodelled"]["count"] == 1
    assert report["unmodelled"]["rows"][0]["id"] == "row-on-unknown-gpu"
    assert "tpu_v9" in report["unmodelled"]["rows"][0]["reason"]
    assert set(report["per_model"]) == {
        "meta-llama/Llama-3.1-70B",
        "meta-llama/Llama-3.1-8B-Instruct",
    }
    for s in [report["overall"], *report["per_backend"].values(), *report["per_model"].values()]:
        assert s["ttft_median_ape_pct"] >= 0 and s["tpot_p90_ape_pct"] >= s["tpot_median_ape_pct"]
    lomo = report["leave_one_model_out"]
    assert lomo["overall"]["rows"] == 8
    assert "| **overall** |" in proc.stdout
    assert "row-on-unknown-gpu" in proc.stdout
    assert out_json.with_suffix(".md").exists()


def test_csv_missing_a_column_is_a_user_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,backend\nx,vllm\n")
    with pytest.raises(UserError, match="model_path"):
        read_rows(bad)
