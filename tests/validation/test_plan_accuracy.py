"""benchmarks/plan_accuracy.py on a small slice of the measured CSV (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.errors import UserError
from gpufleet.perf.calibration import calibration_from_dict
from gpufleet.validation.fit import main as calibration_main
from gpufleet.validation.measured import MeasuredRow, model_row, read_rows

from .helpers import benchmark_module

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "plan_accuracy.py"
CONFIGS = ROOT / "src" / "gpufleet" / "specs" / "data" / "models"

SAMPLE = Path(__file__).parent / "data" / "measured_serving_sample.csv"


@pytest.mark.process
def test_benchmark_reports_errors_per_group_and_names_unmodelled_rows(tmp_path: Path) -> None:
    out_json = tmp_path / "acc.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(SAMPLE),
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
    assert set(lomo["per_group"]) == set(report["per_model"])
    logo = report["leave_one_gpu_out"]  # held out by GPU: h100 rows scored by h200's fit
    assert logo["overall"]["rows"] == 8 and set(logo["per_group"]) == {"h100_sxm", "h200_sxm"}
    assert "| **leave-one-GPU-out** |" in proc.stdout
    # Beside them, the same search from the same prior on all rows (comparable in-sample).
    assert report["in_sample_from_prior"]["overall"]["rows"] == 8
    assert set(report["fit_objective"]) == {"shipped", "from_prior"}
    assert "| in-sample, fitted from the prior |" in proc.stdout
    assert "| in-sample |" in proc.stdout and "| leave-one-model-out |" in proc.stdout
    assert "| **overall** |" in proc.stdout
    assert "row-on-unknown-gpu" in proc.stdout
    assert out_json.with_suffix(".md").exists()
    # Rows impossible as labelled are listed apart, and stay counted in every figure.
    assert report["infeasible_as_labelled"] == {"rows": 0, "ids": []}
    report["infeasible_as_labelled"] = {
        "rows": 1,
        "ids": [["row-x", "needs the GPUs 157% busy"]],
        "ttft_median_ape": 40.8,
        "tpot_median_ape": 188.0,
    }
    with benchmark_module("plan_accuracy_md") as md:
        text = md.markdown(report)
    assert "Rows impossible as labelled" in text and "40.8 / 188.0 %" in text
    assert "- row-x: needs the GPUs 157% busy" in text


def test_csv_missing_a_column_is_a_user_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("id,backend\nx,vllm\n")
    with pytest.raises(UserError, match="model_path"):
        read_rows(bad)


def _row(**kw: object) -> MeasuredRow:
    base: dict[str, object] = dict(
        id="r", backend="trtllm", model_path="deepseek-ai/DeepSeek-V3", system="h200_sxm",
        gemm_quant="fp8", moe_quant="fp8", isl=1024, osl=1024, batch_size=16, tp=1, pp=1,
        attention_dp=8, moe_tp=1, moe_ep=8, ttft_s=1.0, tpot_s=0.03,
    )  # fmt: skip
    base.update(kw)
    return MeasuredRow(**base)  # type: ignore[arg-type]


def test_attention_dp_rows_run_batch_size_clients_per_rank() -> None:
    p = model_row(_row())
    assert p.serving.concurrency == 16  # 16 per rank x 8 ranks = 128 clients on 8 GPUs
    assert not p.note
    # The same 128 clients labelled as 64 ranks of 2 on 64 GPUs (moe_tp 8 x ep 8): the
    # shared CSV's twin rows show it ran on one 8-GPU node; read so, same prediction.
    q = model_row(_row(attention_dp=64, moe_tp=8, batch_size=2))
    assert q.serving.concurrency == 16
    assert (q.ttft_s, q.tpot_s) == (p.ttft_s, p.tpot_s)
    assert "read as one node" in q.note and "128 clients" in q.note
    # tp 64 labels likewise: attention TP 8 over the node's GPUs.
    r = model_row(_row(tp=64, attention_dp=1, moe_tp=8, batch_size=16))
    assert "tp 8" in r.note


def test_rows_beyond_the_kv_cache_queue_for_admission() -> None:
    fits = model_row(_row(model_path="meta-llama/Llama-3.1-70B", attention_dp=1, moe_ep=1,
                          tp=1, isl=1024, osl=8192, batch_size=16))  # fmt: skip
    over = model_row(_row(model_path="meta-llama/Llama-3.1-70B", attention_dp=1, moe_ep=1,
                          tp=1, isl=1024, osl=8192, batch_size=128))  # fmt: skip
    assert over.ttft_s > 20 * fits.ttft_s  # clients wait for whole requests to finish


def test_unknown_quant_mode_is_named() -> None:
    with pytest.raises(UserError, match="quant"):
        model_row(_row(gemm_quant="int3"))


def test_calibration_refits_and_writes_loadable_constants(tmp_path: Path) -> None:
    out = tmp_path / "cal.yaml"
    assert calibration_main([str(SAMPLE), "--out", str(out), "--rounds", "1"]) == 0
    cal = calibration_from_dict(yaml.safe_load(out.read_text()))
    assert 0 < cal.gemm_efficiency <= 1 and 0 < cal.memory_efficiency <= 1
    assert cal.backend("trtllm").step_overhead_s >= 0
    # The refit is used as given: predictions change with it.
    row = read_rows(SAMPLE)[0]
    assert model_row(row, cal).tpot_s > 0


@pytest.mark.process
def test_benchmark_on_a_missing_csv_says_so() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "/nonexistent/rows.csv", "--no-lomo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "cannot read" in proc.stderr and "Traceback" not in proc.stderr
