"""Bugs the plan sweep (benchmarks/plan_sweep.py) found, each pinned by a test that fails
without its fix. Runs `gpufleet plan` through the CLI's own entry in this process."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest

from gpufleet.errors import UserError
from gpufleet.plan.search import PlanRequest, plan
from gpufleet.specs import load_gpu, load_model

ROOT = Path(__file__).resolve().parents[2]
QWEN_06B = ROOT / "tests" / "plan" / "data" / "unseen_configs" / "Qwen--Qwen3-0.6B.json"


# The benchmark is a script beside record.py, not a package: import it from its folder.
sys.path.insert(0, str(ROOT / "benchmarks"))
SWEEP = importlib.import_module("plan_sweep")


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--rps", "nan"), ("--rps", "inf"), ("--ttft-slo", "inf"), ("--tpot-slo", "nan"),
     ("--gpu-price", "inf"), ("--gpu-memory-utilization", "nan")],
)  # fmt: skip
def test_nan_and_inf_are_refused_naming_the_flag(flag: str, value: str) -> None:
    # click's FloatRange lets nan through (nan > 0 is false both ways) and an infinite
    # --rps reached int() in the replica count: a traceback instead of an error.
    o = SWEEP.run_cli(["--model", str(QWEN_06B), "--gpu", "l4", flag, value])
    assert o.code == 2, (o.code, o.stderr)
    assert "Traceback" not in o.stderr and flag in o.stderr and "finite" in o.stderr


def test_plan_api_refuses_nan_rps() -> None:
    req = PlanRequest(model=load_model(str(QWEN_06B)), gpu=load_gpu("l4"), rps=math.nan)
    with pytest.raises(UserError, match="--rps"):
        plan(req)


def test_trtllm_attention_dp_command_survives_a_shell() -> None:
    # The DP layout's trtllm-serve line carried `# extra.yaml: enable_attention_dp: true`
    # mid-command: the comment swallowed the line's backslash, so a shell ran the
    # following `--host 0.0.0.0 --port 8000` as a command of its own.
    from gpufleet.plan.layout import Layout
    from gpufleet.plan.render import render_launch_commands

    model = load_model(str(ROOT / "tests/plan/data/unseen_configs/deepseek-ai--DeepSeek-V3.2.json"))
    layout = Layout(tp=1, dp=8, ep=8, weight_dtype="fp8")
    launch = render_launch_commands(model, load_gpu("h200"), layout, max_model_len=8192)
    assert SWEEP.check_commands({"vllm": launch.vllm, "sglang": launch.sglang,
                                 "trtllm": launch.trtllm}) == []  # fmt: skip
    assert "--extra_llm_api_options extra.yaml" in launch.trtllm
    assert any("enable_attention_dp: true" in n for n in launch.notes)


@pytest.mark.parametrize(
    ("key", "value"),
    [("num_key_value_heads", 6), ("num_key_value_heads", -2), ("num_attention_heads", 0),
     ("hidden_size", 0), ("num_hidden_layers", 0), ("vocab_size", 0), ("head_dim", -128),
     ("max_position_embeddings", 0)],
)  # fmt: skip
def test_config_fields_that_size_tensors_are_checked(key: str, value: int, tmp_path: Path) -> None:
    # These planned a model anyway (16 heads over 6 KV heads; 0 heads, 0 vocabulary; -2
    # KV heads) or blamed --gpu ("does not fit even 64 nodes") for 0 layers.
    cfg = json.loads(QWEN_06B.read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "num_attention_heads": 16, key: value}))
    o = SWEEP.run_cli(["--model", str(path), "--gpu", "h100-sxm"])
    assert o.code == 2 and "Traceback" not in o.stderr, (o.code, o.stderr)
    assert o.stderr.startswith(f"error: {key}:") and "fix:" in o.stderr


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_long_prompt_few_outputs_tpot_is_at_least_one_decode_step(engine: str) -> None:
    # --input-tokens 32000 --output-tokens 10: under half a decode in flight on average,
    # the solver rounded the decode batch to 0 and planned TPOT 7e-14 s, below the time to
    # read the weights once (2.7 ms for a 3B bf16 model on an A100).
    model = str(ROOT / "tests/plan/data/unseen_configs/Qwen--Qwen2.5-3B.json")
    args = ["--model", model, "--gpu", "a100-80gb", "--engine", engine,
            "--input-tokens", "32000", "--output-tokens", "10"]  # fmt: skip
    o = SWEEP.plan_case(args, model, 32000)
    assert o.code == 0, o.stderr
    assert [p for p in o.problems if "TPOT" in p] == []
    assert o.plan["chosen"]["performance"]["tpot_s"] > 1e-3


def test_literal_exclude_modules_skip_fnmatch(monkeypatch: pytest.MonkeyPatch) -> None:
    # nvidia/Qwen3-235B-A22B-NVFP4 lists 95 literal exclude_modules; each of its 376
    # (layer, module) pairs was tried against every pattern through fnmatch (1.3 M calls):
    # 1.0-1.6 s of a plan's time, past the 1 s a plan may take. A pattern with no
    # wildcard is now compared as a name (the same answer).
    import fnmatch

    calls = []
    real = fnmatch.fnmatchcase

    def counted(name: str, pattern: str) -> bool:
        calls.append(pattern)
        return real(name, pattern)

    monkeypatch.setattr(fnmatch, "fnmatchcase", counted)
    model = load_model(str(ROOT / "tests/plan/data/modelopt/nvidia--Qwen3-235B-A22B-NVFP4"))
    assert calls == []
    scheme = model.weight_scheme(model.checkpoint_dtype)
    assert scheme.format(0, "experts").name == "nvfp4"
    assert scheme.format(0, "lm_head").name == "bf16"  # excluded: lm_head


def test_request_longer_than_the_model_names_the_lengths_not_max_model_len() -> None:
    # --input-tokens 32000 on an 8192-token model said "--max-model-len: 8192 < input +
    # output tokens (32010) — fix: pass --max-model-len 32010 or more", a fix the next
    # check refuses (> max_position_embeddings).
    model = str(ROOT / "benchmarks/data/model_configs/meta-llama--Meta-Llama-3-8B.json")
    o = SWEEP.run_cli(["--model", model, "--gpu", "h100-sxm", "--input-tokens", "32000",
                       "--output-tokens", "10"])  # fmt: skip
    assert o.code == 2 and "Traceback" not in o.stderr
    assert o.stderr.startswith("error: --input-tokens/--output-tokens:")
    assert "within 8192" in o.stderr and "--max-model-len 32010" not in o.stderr


@pytest.mark.parametrize("gpu", ["gb200", "gb300"])
def test_plan_emit_k8s_on_every_catalog_gpu(gpu: str, tmp_path: Path) -> None:
    # `gpufleet plan --gpu gb200 --emit k8s DIR` failed: no node label for the GPU, and the
    # error's fix (kubernetes.gpu_product) is a fleet-YAML setting `plan` has no way to set.
    o = SWEEP.run_cli(["--model", str(QWEN_06B), "--gpu", gpu, "--emit", "k8s", str(tmp_path)])
    assert o.code == 0, o.stderr
    text = "".join(p.read_text() for p in tmp_path.rglob("*.yaml"))
    assert f"nvidia.com/gpu.product: NVIDIA-{gpu.upper()}" in text
