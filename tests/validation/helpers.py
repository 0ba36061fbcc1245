"""Paths and the benchmark-script import the validation tests share."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "src" / "gpufleet" / "specs" / "data" / "models"
SAMPLE = Path(__file__).parent / "data" / "measured_serving_sample.csv"


@contextmanager
def benchmark_module(name: str) -> Iterator[ModuleType]:
    """benchmarks/NAME.py imported as a module (the scripts are not a package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
