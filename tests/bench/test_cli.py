"""`gpufleet bench` end to end: the CLI as a subprocess against the stub on a real socket."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpufleet.cli import cli
from gpufleet.errors import UserError

GPUFLEET = [sys.executable, "-c", "from gpufleet.cli import main; main()"]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUFLEET, "bench", *args], capture_output=True, text=True, timeout=90, check=False
    )


@pytest.mark.process
def test_cli_run_writes_json_and_table(stub_process: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    plot = tmp_path / "r.png"
    r = bench(
        "--url", stub_process, "--endpoint", "chat", "--rate", "100", "--num-requests", "20",
        "--input-tokens", "12", "--output-tokens", "5", "--goodput", "ttft:60000", "tpot:60000",
        "--json", str(out), "--plot", str(plot),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    assert "Serving Benchmark Result" in r.stdout and "Mean TTFT (ms)" in r.stdout
    data = json.loads(out.read_text())
    m = data["metrics"]
    assert m["completed"] == 20 and m["failed"] == 0
    assert m["request_goodput"] == pytest.approx(m["request_throughput"])
    assert m["total_output_tokens"] == 100
    assert m["total_input_tokens"] == 20 * (12 + 3)  # chat template markers
    assert data["goodput_slo_ms"] == {"ttft": 60000.0, "tpot": 60000.0}
    assert data["server_metrics"]["known"]["generation_tokens"] == 100
    assert len(data["ttfts_ms"]) == 20 and data["client_overhead"]["cpu_util"] >= 0
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize(
    "stub_process", [("--fail-every", "3", "--malformed-every", "4")], indirect=True
)
@pytest.mark.process
def test_cli_reports_failures(stub_process: str, tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    r = bench("--url", stub_process, "--concurrency", "3", "--num-requests", "12",
              "--input-tokens", "4", "--output-tokens", "4", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    kinds = {(f["status"], f["error_type"]): f["count"] for f in data["failures"]}
    assert kinds == {(429, "RateLimitError"): 4, (200, "malformed_chunk"): 2}
    assert "Failures" in r.stdout


@pytest.mark.process
def test_cli_sweep_marks_a_knee_or_says_why(stub_process: str, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    r = bench("--url", stub_process, "--sweep", "concurrency=1,2", "--num-requests", "6",
              "--input-tokens", "4", "--output-tokens", "3", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["param"] == "concurrency" and len(data["points"]) == 2
    assert all(p["metrics"]["completed"] == 6 for p in data["points"])
    assert data["knee_rule"]
    assert "Sweep over concurrency" in r.stdout


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--rate", "5", "--concurrency", "2"], "--concurrency"),
        (["--goodput", "ttft=5"], "--goodput"),
        (["--sweep", "rate=8,4"], "--sweep"),
        (["--ramp", "1-5"], "--ramp"),
        (["--trace", "/nonexistent/trace.csv"], "--trace"),
        (["--extra-body", "[1]"], "--extra-body"),
        (["--input-tokens", "0"], "--input-tokens"),
    ],
)
def test_cli_bad_input_is_a_user_error_naming_the_flag(args: list[str], flag: str) -> None:
    with pytest.raises(UserError) as e:
        cli.main(
            ["bench", "--url", "http://127.0.0.1:9", "--model", "m", *args], standalone_mode=False
        )
    assert e.value.field == flag and e.value.fix


@pytest.mark.process
def test_cli_bad_input_exits_2_without_traceback() -> None:
    r = bench("--url", "http://127.0.0.1:9", "--model", "m", "--goodput", "ttft=5")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--goodput" in r.stderr and "fix:" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.process
def test_cli_all_failed_exits_1() -> None:
    r = bench("--url", "http://127.0.0.1:9", "--model", "m", "--num-requests", "2", "--no-scrape")
    assert r.returncode == 1
    assert "connect_error" in r.stdout


def _started_requests(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("vllm:request_success_total"):
                return int(float(line.rsplit(" ", 1)[1]))
    return 0


@pytest.mark.process
@pytest.mark.parametrize("stub_process", [("--itl-ms", "2")], indirect=True)
def test_ctrl_c_stops_and_reports_what_finished(stub_process: str, tmp_path: Path) -> None:
    out = tmp_path / "i.json"
    proc = subprocess.Popen(
        [*GPUFLEET, "bench", "--url", stub_process, "--concurrency", "4",
         "--num-requests", "100000", "--input-tokens", "4", "--output-tokens", "20",
         "--json", str(out), "--no-scrape"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Closed loop at 4: once 12 have started, at least 8 have finished.
        deadline = time.monotonic() + 60  # hang guard only
        while _started_requests(stub_process) < 12:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stdout + stderr
    data = json.loads(out.read_text())
    assert data["interrupted"] is True
    assert 8 <= data["metrics"]["completed"] < 100000
    assert data["metrics"]["failed"] == 0
    assert "interrupted" in stdout
