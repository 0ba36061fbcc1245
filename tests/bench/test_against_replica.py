"""`gpufleet bench` against a real `gpufleet replica` subprocess (simulated engine, real HTTP)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.replica.testing import ReplicaProcess

pytestmark = pytest.mark.process  # every test here starts processes or servers

CLI = [sys.executable, "-c", "from gpufleet.cli import main; main()", "bench"]


def test_bench_reads_prefix_cache_hits_from_a_replica(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with ReplicaProcess("--step-time", "base_s=0.002,per_token_s=1e-6") as replica:
        # Closed loop at concurrency 1: each request's prefill is done before the next one
        # arrives, so every request after the first of its group hits the whole 256-token
        # prefix (16 blocks of 16) and nothing else.
        r = subprocess.run(
            [*CLI, "--url", replica.url, "--concurrency", "1", "--num-requests", "12",
             "--prefix-groups", "3", "--prefix-tokens", "256", "--input-tokens", "20",
             "--output-tokens", "6", "--json", str(out), "--quiet"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    m = data["metrics"]
    assert m["completed"] == 12 and m["failed"] == 0
    assert m["total_input_tokens"] == 12 * 276  # from the replica's usage
    assert m["total_output_tokens"] == 12 * 6
    known = data["server_metrics"]["known"]
    assert known["prefix_cache_queries"] == 12 * 276
    assert known["prefix_cache_hits"] == (12 - 3) * 256
    assert known["preemptions"] == 0
    assert known["generation_tokens"] == 12 * 6
    assert m["mean_ttft_ms"] > 0 and m["mean_tpot_ms"] > 0


def test_mooncake_hash_ids_become_prefix_cache_hits(tmp_path: Path) -> None:
    trace = "sample:mooncake"  # the first rows of the Mooncake trace, shipped with the package
    out = tmp_path / "m.json"
    with ReplicaProcess(
        "--step-time", "base_s=0.001,per_token_s=1e-7", "--time-scale", "0.2"
    ) as replica:
        # The first 5 records share only hash id 0 (one 512-token block); closed loop at
        # concurrency 1 so each prefill lands in the cache before the next request.
        r = subprocess.run(
            [*CLI, "--url", replica.url, "--trace", trace, "--num-requests", "5",
             "--concurrency", "1", "--json", str(out), "--quiet"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["metrics"]["completed"] == 5
    assert data["metrics"]["total_input_tokens"] == 6758 + 7322 + 7236 + 2290 + 6760
    assert data["server_metrics"]["known"]["prefix_cache_hits"] == 4 * 512


def test_preemptions_under_kv_pressure_are_reported(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    # 40 blocks of 16 tokens hold 640 tokens; 4 requests of 100 + 100 tokens sent together
    # need 800 once they have decoded, so the replica must preempt at least once.
    with ReplicaProcess(
        "--step-time", "base_s=0.001", "--num-gpu-blocks-override", "40", "--max-model-len", "512"
    ) as replica:
        r = subprocess.run(
            [*CLI, "--url", replica.url, "--concurrency", "4", "--num-requests", "4",
             "--input-tokens", "100", "--output-tokens", "100", "--json", str(out), "--quiet"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["metrics"]["completed"] == 4 and data["metrics"]["failed"] == 0
    assert data["server_metrics"]["known"]["preemptions"] >= 1
