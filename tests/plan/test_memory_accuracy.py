"""benchmarks/memory_accuracy.py against the real vLLM startups shipped in the repo
(benchmarks/data/vllm_startups.csv, each row with its public source)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data" / "vllm_startups.csv"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "memory_accuracy", ROOT / "benchmarks" / "memory_accuracy.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_startups_are_diverse_and_sourced() -> None:
    with DATA.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 20
    assert all(r["source"].startswith("https://") for r in rows)
    assert {r["tp"] for r in rows} >= {"1", "2", "4", "8"} and any(r["pp"] != "1" for r in rows)


@pytest.mark.process  # importing the benchmark stamps the run with `git rev-parse`
def test_weights_and_kv_within_3_percent_median_10_worst() -> None:
    report = _benchmark().run(DATA)
    for key in ("weights_gib", "kv_gib", "kv_tokens"):
        s = report["summary"][key]
        assert s["cases"] >= 5, key
        assert s["median_abs_error_pct"] <= 3.0, (key, s)
        assert s["worst_abs_error_pct"] <= 10.0, (key, s)
