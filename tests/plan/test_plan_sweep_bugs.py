"""Bugs the plan sweep (benchmarks/plan_sweep.py) found, each pinned by a test that fails
without its fix. Runs `gpufleet plan` through the CLI's own entry in this process."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpufleet.errors import UserError
from gpufleet.plan.search import PlanRequest, plan
from gpufleet.specs import load_gpu, load_model

ROOT = Path(__file__).resolve().parents[2]
QWEN_06B = ROOT / "tests" / "plan" / "data" / "unseen_configs" / "Qwen--Qwen3-0.6B.json"


def _sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plan_sweep", ROOT / "benchmarks" / "plan_sweep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["plan_sweep"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SWEEP = _sweep()


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
