"""`gpufleet bench` through a real `gpufleet gateway` in front of two real replicas."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpufleet.replica.testing import ReplicaProcess

pytestmark = pytest.mark.process  # every test here starts processes or servers

CLI = [sys.executable, "-c", "from gpufleet.cli import main; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_models(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s  # hang guard only
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
                if json.loads(resp.read()).get("data"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("gateway never listed a model")


def test_bench_reports_gateway_retries_and_per_replica_counts(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    step = ("--step-time", "base_s=0.002")
    with ReplicaProcess(*step) as healthy, ReplicaProcess(*step, "--fail-next", "2") as flaky:
        port = free_port()
        gateway = subprocess.Popen(
            [*CLI, "gateway", "--replica", healthy.url, "--replica", flaky.url,
             "--port", str(port), "--log-level", "WARNING"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_models(url)
            r = subprocess.run(
                [*CLI, "bench", "--url", url, "--concurrency", "2", "--num-requests", "20",
                 "--input-tokens", "16", "--output-tokens", "3", "--json", str(out), "--quiet",
                 "--metrics-url", healthy.url, "--metrics-url", flaky.url],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
        finally:
            gateway.terminate()
            try:
                gateway.wait(timeout=10)
            except subprocess.TimeoutExpired:
                gateway.kill()
                gateway.wait()
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["metrics"]["completed"] == 20 and data["metrics"]["failed"] == 0
    server = data["server_metrics"]
    # The flaky replica refused its first two requests; the gateway retried them elsewhere.
    assert server["known"]["gateway_retries"] == 2
    assert server["known"]["gateway_replica_errors"] == 2
    per_replica = server["per_replica"]
    assert len(per_replica) == 2
    attempts = sum(s["gpufleet_gateway_replica_requests_total"] for s in per_replica.values())
    assert attempts == 22
    # --metrics-url adds the replicas' own counters, labelled by target
    assert server["known"]["generation_tokens"] == 20 * 3
    assert any(f'target="{flaky.url}"' in k for k in server["counter_deltas"])
