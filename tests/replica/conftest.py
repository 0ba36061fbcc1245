"""A real `gpufleet replica` subprocess shared by a test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.replica.testing import ReplicaProcess


@pytest.fixture(scope="module")
def replica() -> Iterator[ReplicaProcess]:
    """A replica with fast explicit step times (2 ms per iteration)."""
    with ReplicaProcess("--step-time", "base_s=0.002,per_token_s=1e-6") as r:
        yield r
