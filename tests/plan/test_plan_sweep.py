"""A fast subset of benchmarks/plan_sweep.py: `gpufleet plan` through the CLI's own entry
on configs of every kind in the repo (dense, GQA, sliding window, hybrid linear attention,
MoE, MLA, ModelOpt FP8 / NVFP4 checkpoints) x GPUs x engines x the options a user tries,
checking invariants rather than constants (see the benchmark for the whole sweep)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNSEEN = ROOT / "tests" / "plan" / "data" / "unseen_configs"
CONFIGS = [
    UNSEEN / "Qwen--Qwen3-0.6B.json",  # dense, GQA
    UNSEEN / "Qwen--Qwen3-Next-80B-A3B-Thinking.json",  # hybrid linear attention, MoE
    UNSEEN / "deepseek-ai--DeepSeek-V3.2.json",  # MLA, MoE, sparse indexer
    UNSEEN / "XiaomiMiMo--MiMo-V2-Flash.json",  # sliding window, MoE
    ROOT / "tests/plan/data/modelopt/nvidia--Qwen3-235B-A22B-NVFP4",  # NVFP4 checkpoint
    ROOT / "benchmarks/data/model_configs/google--gemma-3-4b-it.json",  # multimodal, SWA
]


# The benchmark is a script beside record.py, not a package: import it from its folder.
sys.path.insert(0, str(ROOT / "benchmarks"))
SWEEP = importlib.import_module("plan_sweep")


def test_the_sweep_covers_every_repo_config() -> None:
    paths = SWEEP.config_paths(None)
    assert len(paths) >= 40 and all(p.exists() for p in CONFIGS)
    assert set(CONFIGS) <= set(paths)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name.split("--")[-1])
@pytest.mark.parametrize("gpu", ["h100-sxm", "l4", "b200"])
def test_every_engine_plans_or_refuses_cleanly(config: Path, gpu: str) -> None:
    for engine in ("vllm", "sglang", "trtllm"):
        o = SWEEP.plan_case(["--model", str(config), "--gpu", gpu, "--engine", engine], str(config))
        o.problems = [p for p in o.problems if not p.startswith("took")]  # no timing in tests
        assert o.problems == [], (engine, o.problems)


@pytest.mark.parametrize("option", sorted(SWEEP.OPTIONS))
def test_user_options_keep_the_invariants(option: str) -> None:
    extra = SWEEP.OPTIONS[option]
    tokens = int(extra[extra.index("--input-tokens") + 1]) if "--input-tokens" in extra else 1024
    for i, config in enumerate(CONFIGS[:4]):
        gpu, engine = ("h100-sxm", "b200", "l4")[i % 3], ("vllm", "sglang", "trtllm")[i % 3]
        args = ["--model", str(config), "--gpu", gpu, "--engine", engine, *extra]
        o = SWEEP.plan_case(args, str(config), tokens)
        o.problems = [p for p in o.problems if not p.startswith("took")]
        assert o.problems == [], (config.name, o.problems)


def test_printed_plans_and_monotonic_sanity() -> None:
    for config, gpu, engine in ((CONFIGS[0], "l4", "vllm"), (CONFIGS[1], "h100-sxm", "sglang"),
                                (CONFIGS[2], "b200", "trtllm")):  # fmt: skip
        o = SWEEP.run_cli(["--model", str(config), "--gpu", gpu, "--engine", engine])
        assert o.code == 0 and SWEEP.check_text(o.stdout) == [], o.stderr
        assert SWEEP.monotonic(str(config), gpu, engine) == []


def test_malformed_inputs_are_refused_naming_the_field() -> None:
    with SWEEP.malformed_dir() as tmp:
        cases = SWEEP.malformed_cases(tmp)
        assert len(cases) >= 25
        bad = {}
        for name, (args, field_name) in cases.items():
            problems = SWEEP.check_malformed(SWEEP.run_cli(args), field_name)
            if problems:
                bad[name] = problems
    assert bad == {}
