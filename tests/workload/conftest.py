from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_dir() -> Path:
    """The project's shared/ folder: $GPUFLEET_SHARED, else the nearest ancestor's shared/."""
    env = os.environ.get("GPUFLEET_SHARED")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "shared" / "traces"
        if candidate.is_dir():
            return candidate.parent
    raise FileNotFoundError("shared/traces not found above the repository; set GPUFLEET_SHARED")


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    return shared_dir() / "traces"
