"""What every verb promises a script: `--json -` is JSON alone on stdout; a busy port is one
line with the fix (no traceback); --url names a server, not an endpoint."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.replica.testing import ReplicaProcess

CLI = [sys.executable, "-c", "from gpufleet.cli import main; main()"]
MODEL = "meta-llama/Llama-3.1-8B"


pytestmark = pytest.mark.process  # starts processes and servers on loopback


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    "verb",
    [
        ["replica", "--model", MODEL],
        ["gateway", "--replica", "http://127.0.0.1:9"],
        ["up"],
    ],
    ids=["replica", "gateway", "up"],
)
def test_busy_port_is_one_line_with_the_fix(verb: list[str], busy_port: int) -> None:
    r = run(*verb, "--port", str(busy_port), timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"127.0.0.1:{busy_port} is already in use" in lines[0]
    assert "--port 0" in lines[0]
    assert "Traceback" not in r.stderr and "Unclosed" not in r.stderr


def test_plan_and_sim_json_to_stdout() -> None:
    r = run("plan", "--model", MODEL, "--gpu", "h100-sxm", "--json", "-")
    assert r.returncode == 0, r.stderr
    assert "tp" in json.dumps(json.loads(r.stdout))
    r = run("plan", "--model", MODEL, "--gpu", "h100-sxm", "--json")  # bare --json: stdout
    json.loads(r.stdout)
    r = run("sim", "--rate", "20", "--num-requests", "30", "--input-tokens", "50",
            "--output-tokens", "5", "--json", "-")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["completed"] == 30
    assert "TTFT" in r.stderr  # the table a person reads went to stderr


def test_bench_json_to_stdout_and_endpoint_urls(tmp_path: Path) -> None:
    with ReplicaProcess("--step-time", "base_s=0.002,per_token_s=1e-6") as replica:
        common = ["--num-requests", "4", "--concurrency", "2", "--input-tokens", "8",
                  "--output-tokens", "3", "--quiet", "--no-scrape"]  # fmt: skip
        r = run("bench", "--url", replica.url, *common, "--json", "-")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["metrics"]["completed"] == 4
        r = run("bench", "--url", replica.url + "/v1/chat/completions", *common, "--json", "-")
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        assert data["config"]["endpoint"] == "chat" and data["config"]["url"] == replica.url
        assert "note: --url names an endpoint" in r.stderr
        r = run("bench", "--url", replica.url + "/v1/models", *common)
        assert r.returncode == 2 and "not a server's base URL" in r.stderr
        r = run("bench", "--url", replica.url + "/v1/completions", "--endpoint", "chat", *common)
        assert r.returncode == 2 and "--endpoint is chat" in r.stderr


def test_up_demo_json_to_stdout(tmp_path: Path) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(
        "replicas:\n  startup_s: 0.2\nautoscale:\n  min_replicas: 1\n  max_replicas: 1\n"
    )
    proc = subprocess.Popen(
        [
            *CLI,
            "up",
            str(cfg),
            "--demo",
            "--port",
            "0",
            "--json",
            "-",
            "--report",
            str(tmp_path / "report"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        m = re.search(r"gateway on (http://127\.0\.0\.1:\d+)", proc.stderr.readline())
        assert m, "no gateway line"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # stop once the demo traffic got answers
            with urllib.request.urlopen(m.group(1) + "/metrics", timeout=5) as resp:
                if re.search(
                    r'gpufleet_gateway_requests_total\{[^}]*code="200"', resp.read().decode()
                ):
                    break
            time.sleep(0.5)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads(out)  # nothing but the JSON document on stdout
    assert summary["requests"] >= 1 and "capacity_per_replica" in summary
    assert (tmp_path / "report" / "index.html").exists()  # --report: PNGs and the page
