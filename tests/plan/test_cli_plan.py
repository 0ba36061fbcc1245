"""`gpufleet plan` as a user runs it: a real subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # every test here starts processes or servers

GPUFLEET = [sys.executable, "-c", "from gpufleet.cli import main; main()"]
SAMPLE = [
    "plan", "--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100-sxm", "--gpus-per-node", "8",
    "--input-tokens", "1024", "--output-tokens", "256", "--rps", "20",
    "--ttft-slo", "1.0", "--tpot-slo", "0.05",
]  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUFLEET, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_sample_plan_prints_tables_trail_and_commands() -> None:
    r = run(*SAMPLE)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for text in ("Memory per GPU", "Decisions", "Performance per layout", "Plan:",
                 "vllm serve meta-llama/Meta-Llama-3.1-70B", "--tensor-parallel-size 2",
                 "python -m sglang.launch_server", "bf16 weights 131.4 GiB"):  # fmt: skip
        assert text in out


def test_json_output_is_the_whole_plan() -> None:
    r = run(*SAMPLE, "--json", "--gpu-price", "2.0")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["model"] == "meta-llama/Meta-Llama-3.1-70B" and d["price_per_gpu_hour_usd"] == 2.0
    chosen = d["chosen"]
    assert chosen["layout"]["tp"] == 2 and chosen["replicas"] >= 1
    assert chosen["cost_per_hour_usd"] == 2.0 * chosen["total_gpus"]
    perf = chosen["performance"]
    assert perf["slo_met"] and perf["ttft_s"] <= 1.0 and perf["tpot_s"] <= 0.05
    assert chosen["memory"]["kv_cache_bytes"] > 0
    assert d["decisions"][0]["step"] == "precision"


def test_unknown_model_and_gpu_list_close_names() -> None:
    r = run("plan", "--model", "meta-llama/Llama-3.1-7B", "--gpu", "h100")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unknown model" in r.stderr and "Meta-Llama-3.1-70B" in r.stderr
    r = run("plan", "--model", "llama-3.1-8b", "--gpu", "h1000")
    assert r.returncode == 2 and "close names: h100-sxm" in r.stderr


def test_impossible_request_says_what_it_would_need() -> None:
    r = run("plan", "--model", "meta-llama/Llama-3.1-405B", "--gpu", "h100-sxm", "--quant", "bf16",
            "--max-gpus", "8")  # fmt: skip
    assert r.returncode == 2
    assert "needs 2 nodes of 8 × h100-sxm with PP=2" in r.stderr
    assert "--max-gpus 8 allows none" in r.stderr


def test_config_path_missing_field_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2}))
    r = run("plan", "--model", str(tmp_path), "--gpu", "l4")
    assert r.returncode == 2 and "num_attention_heads" in r.stderr


def test_config_path_plans(tmp_path: Path) -> None:
    src = Path(__file__).parents[2] / "src/gpufleet/specs/data/models/Qwen--Qwen3-8B.json"
    (tmp_path / "config.json").write_text(src.read_text())
    r = run("plan", "--model", str(tmp_path / "config.json"), "--gpu", "l40s", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["chosen"]["layout"]["tp"] >= 1


def test_bad_flag_values_are_rejected() -> None:
    r = run("plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--quant", "fp6")
    assert r.returncode == 2 and "--quant" in r.stderr
    r = run("plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--rps", "0")
    assert r.returncode == 2 and "--rps" in r.stderr


def test_help_lists_every_flag() -> None:
    r = run("plan", "--help")
    assert r.returncode == 0
    for flag in ("--model", "--gpu", "--gpus-per-node", "--input-tokens", "--output-tokens",
                 "--rps", "--ttft-slo", "--tpot-slo", "--quant", "--kv-dtype",
                 "--max-model-len", "--max-gpus", "--gpu-price", "--json"):  # fmt: skip
        assert flag in r.stdout


def test_engine_memory_fraction_and_disaggregation_options() -> None:
    r = run("plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rps", "5",
            "--engine", "sglang", "--gpu-memory-utilization", "0.85", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["chosen"]["memory"]["engine"] == "sglang"
    assert d["chosen"]["memory"]["gpu_memory_utilization"] == 0.85
    assert "--mem-fraction-static 0.85" in d["launch"]["sglang"]
    assert d["recommended"] in ("aggregated", "disaggregated")
    assert "NixlConnector" in d["disaggregated"]["launch"]["vllm_decode"]
    r = run("plan", "--model", "llama-3.1-8b", "--gpu", "b200", "--quant", "nvfp4",
            "--disagg", "off")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "nvfp4" in r.stdout and "vLLM logs" in r.stdout and "trtllm-serve" in r.stdout
    assert "Disaggregated prefill / decode" not in r.stdout
    r = run(
        "plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpu-memory-utilization", "1.5"
    )
    assert r.returncode == 2 and "--gpu-memory-utilization" in r.stderr
