"""The engine-driven closed loop (validation.engine_loop): the real Engine on virtual time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import LinearStepTimeModel, StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.plan.perf_serving import predict_closed_loop
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu
from gpufleet.validation.engine_loop import SeparatePrefillStepModel, simulate_closed_loop
from gpufleet.validation.measured import model_row, read_rows

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).parent / "data" / "measured_serving_sample.csv"


def _llama70b_tp4() -> RooflineStepTimeModel:
    return RooflineStepTimeModel(
        load_model("meta-llama/Llama-3.1-70B"), load_gpu("h200"), Layout(tp=4, weight_dtype="fp8")
    )


def test_one_client_sees_its_own_prefill_then_one_decode_step_per_token() -> None:
    model = LinearStepTimeModel(base_s=0.01, per_token_s=0.0001)
    r = simulate_closed_loop(model, 100, 20, 1, first_wave=False)
    # Alone: the prompt is one iteration of 100 tokens, every later token one of 1 token.
    assert r.ttft_s == pytest.approx(0.01 + 100 * 0.0001)
    assert r.tpot_s == pytest.approx(0.01 + 0.0001)
    assert r.measured_requests >= 1


def test_first_wave_prompts_queue_behind_each_other() -> None:
    # A budget of one prompt per iteration, outputs of one token (no decodes alongside):
    # prompt i gets its first token at the end of iteration i.
    model = LinearStepTimeModel(base_s=0.02)
    r = simulate_closed_loop(model, 64, 1, 4, max_num_batched_tokens=64)
    assert r.first_wave_ttft_s == pytest.approx(0.02 * (1 + 2 + 3 + 4) / 4)


def test_more_clients_stretch_ttft_and_tpot() -> None:
    model = _llama70b_tp4()
    light = simulate_closed_loop(model, 2048, 256, 4)
    heavy = simulate_closed_loop(model, 2048, 256, 64)
    assert heavy.tpot_s > light.tpot_s
    assert heavy.ttft_s > light.ttft_s
    assert heavy.first_wave_ttft_s > 5 * light.first_wave_ttft_s  # 64 prompts at once


def test_engine_and_analytic_closed_loops_agree_roughly() -> None:
    model = _llama70b_tp4()
    for isl, osl, c in ((1024, 1024, 16), (8192, 256, 8)):
        sim = simulate_closed_loop(model, isl, osl, c, first_wave=False)
        ana = predict_closed_loop(model, isl, osl, c)
        assert sim.tpot_s == pytest.approx(ana.tpot_s, rel=0.25)
        assert sim.ttft_s == pytest.approx(ana.ttft_s, rel=0.6)


def test_clients_beyond_max_running_wait_for_whole_requests() -> None:
    model = LinearStepTimeModel(base_s=0.01)
    fits = simulate_closed_loop(model, 32, 50, 8, max_running=8, first_wave=False)
    over = simulate_closed_loop(model, 32, 50, 8, max_running=4, first_wave=False)
    # Half the clients wait about one request lifetime (~50 iterations) for a slot.
    assert over.ttft_s > 10 * fits.ttft_s


def test_separate_prefill_batches_cost_prefill_plus_decode() -> None:
    inner = LinearStepTimeModel(base_s=0.005, per_token_s=0.001)
    sep = SeparatePrefillStepModel(inner)
    mixed = StepBatch(prefill_tokens=(100,), prefill_context_tokens=(0,), num_decode=10,
                      decode_context_tokens=1000)  # fmt: skip
    assert sep.step_time_s(mixed) == pytest.approx((0.005 + 0.1) + (0.005 + 0.01))
    only_decode = StepBatch(num_decode=10, decode_context_tokens=1000)
    assert sep.step_time_s(only_decode) == inner.step_time_s(only_decode)


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        simulate_closed_loop(LinearStepTimeModel(), 0, 10, 1)


def test_engine_mode_predicts_measured_rows() -> None:
    for row in read_rows(SAMPLE)[:5]:
        e = model_row(row, engine=True)
        a = model_row(row)
        assert e.engine is not None and e.engine.measured_requests >= 1
        assert e.ttft_s > 0 and e.tpot_s > 0
        assert e.tpot_s == pytest.approx(a.tpot_s, rel=0.3)


@pytest.mark.process
def test_benchmark_engine_mode_reports_both_closed_loops(tmp_path: Path) -> None:
    out_json = tmp_path / "acc.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "plan_accuracy.py"),
            str(SAMPLE),
            "--engine",
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out_json.read_text())
    assert report["closed_loop"] == "engine"
    assert report["overall"]["rows"] == 8 and report["analytic"]["overall"]["rows"] == 8
    assert report["leave_one_model_out"]["overall"]["rows"] == 8
    assert "TTFT engine %" in proc.stdout


def test_the_iteration_cap_never_cuts_the_warm_up_short() -> None:
    model = LinearStepTimeModel(base_s=0.01, per_token_s=1e-5)
    r = simulate_closed_loop(model, 1000, 100, 64, max_request_steps=50, first_wave=False)
    assert r.tpot_s > 0 and r.ttft_s > 0
    assert r.measured_requests >= 1
