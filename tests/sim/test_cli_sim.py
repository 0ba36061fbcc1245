"""`gpufleet sim` as a user runs it: a real subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.cli import main

GPUFLEET = [sys.executable, "-c", "from gpufleet.cli import main; main()"]
SMALL = ["sim", "--rate", "20", "--num-requests", "80", "--input-tokens", "300",
         "--output-tokens", "30"]  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUFLEET, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.process
def test_report_and_json(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    r = run(*SMALL, "--replicas", "2", "--policy", "least_outstanding", "--json", str(out))
    assert r.returncode == 0, r.stderr
    for text in ("TTFT (ms)", "TPOT (ms)", "Prefix cache hit rate", "Replica-seconds", "80 / 0"):
        assert text in r.stdout
    d = json.loads(out.read_text())
    assert d["completed"] == 80 and d["failed"] == 0 and d["replicas_used"] == 2
    assert d["ttft_ms"]["p99"] >= d["ttft_ms"]["median"] > 0
    assert d["sim_events"] > 80 and d["scenario"] == "least_outstanding"


@pytest.mark.process
def test_sweep_over_routing_policies_prints_one_row_each(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    r = run(
        "sim", "--rate", "40", "--num-requests", "150", "--input-tokens", "64",
        "--output-tokens", "8", "--prefix-groups", "15", "--prefix-tokens", "1024",
        "--replicas", "4", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.3",
        "--sweep", "routing=round_robin,prefix_aware", "--workers", "2", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "| routing=round_robin |" in r.stdout and "| routing=prefix_aware |" in r.stdout
    rows = {row["scenario"]: row for row in json.loads(out.read_text())["rows"]}
    assert (
        rows["routing=prefix_aware"]["prefix_cache_hit_rate"]
        > rows["routing=round_robin"]["prefix_cache_hit_rate"]
    )


@pytest.mark.process
def test_sweep_over_fleet_size_cuts_queueing() -> None:
    r = run(
        "sim", "--rate", "30", "--num-requests", "150", "--input-tokens", "2000",
        "--output-tokens", "100", "--max-num-seqs", "8", "--sweep", "replicas=1,4",
        "--workers", "1",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = [ln.split("|") for ln in r.stdout.splitlines() if ln.startswith("| replicas=")]
    p99 = {cells[1].strip(): float(cells[5]) for cells in rows}  # the TTFT p99 ms column
    assert p99["replicas=4"] < p99["replicas=1"] / 2, r.stdout


@pytest.mark.process
def test_trace_replay_with_autoscaling(tmp_path: Path) -> None:
    trace = tmp_path / "mc.jsonl"
    lines = [
        {"timestamp": i * 50, "input_length": 700, "output_length": 20, "hash_ids": [0, i + 1]}
        for i in range(60)
    ]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = run(
        "sim", "--trace", str(trace), "--speedup", "2", "--autoscale", "queue_depth",
        "--min-replicas", "1", "--max-replicas", "3", "--startup-s", "5",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "60 / 0" in r.stdout and "Scaling ticks / changes" in r.stdout


@pytest.mark.process
def test_bad_input_names_the_flag() -> None:
    r = run(*SMALL, "--policy", "nope")  # as a user sees it: exit 2, no traceback
    assert r.returncode == 2 and "policy" in r.stderr and "round_robin" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sim"], "--trace"),
        ([*SMALL, "--sweep", "color=red"], "--sweep"),
        ([*SMALL, "--sweep", "replicas=two"], "int"),
        ([*SMALL, "--range-ratio", "1.5"], "--range-ratio"),
        (["sim", "--trace", "x.jsonl", "--rate", "3"], "--rate"),
        (["sim", "--trace", "/nonexistent/trace.csv"], "no such file"),
        ([*SMALL, "--autoscale", "hpa", "--autoscale-param", "bogus=1"], "bogus"),
        ([*SMALL, "--prefix-tokens", "100"], "--prefix-groups"),
        (["sim", "--concurrency", "4"], "--num-requests"),
        ([*SMALL, "--concurrency", "4"], "--concurrency"),
    ],
)
def test_more_bad_input_in_process(
    args: list[str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same `main()` a user runs, in this process (each case costs no interpreter start)."""
    monkeypatch.setattr(sys, "argv", ["gpufleet", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and err.startswith("error:")


@pytest.mark.process
def test_a_seed_fixes_the_run_across_processes(tmp_path: Path) -> None:
    """Same figures from processes with different string-hash salts (PYTHONHASHSEED)."""
    args = [*SMALL, "--prefix-groups", "6", "--prefix-tokens", "256", "--replicas", "3",
            "--policy", "prefix_aware", "--range-ratio", "0.5", "--seed", "4"]  # fmt: skip
    figures = []
    for salt in ("1", "2"):
        out = tmp_path / f"run{salt}.json"
        r = subprocess.run(
            [*GPUFLEET, *args, "--json", str(out)], capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONHASHSEED": salt}, check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        d = json.loads(out.read_text())
        figures.append({k: v for k, v in d.items() if not k.startswith("sim_")})
    assert figures[0] == figures[1]
    assert figures[0]["prefix_cache_hits_tokens"] > 0


def test_queue_max_size_answers_the_gateways_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet scaling from zero: 3 requests wait for the cold start, the rest of the burst
    finds the gateway's queue full (`--queue-max-size`) and fails as `queue_full`."""
    out = tmp_path / "q.json"
    monkeypatch.setattr(sys, "argv", [
        "gpufleet", "sim", "--rate", "200", "--num-requests", "30", "--input-tokens", "100",
        "--output-tokens", "10", "--autoscale", "queue_depth", "--min-replicas", "0",
        "--replicas", "0", "--startup-s", "5", "--queue-max-size", "3", "--json", str(out),
    ])  # fmt: skip
    try:
        main()
    except SystemExit as exc:
        assert exc.code in (0, None)
    d = json.loads(out.read_text())
    assert d["failures"] == {"queue_full": 27} and d["completed"] == 3


def test_the_sample_trace_replays_on_a_fresh_install(capsys: pytest.CaptureFixture[str]) -> None:
    """`--trace sample:mooncake` needs nothing beside the package (the README's example)."""
    args = ["sim", "--trace", "sample:mooncake", "--duration", "20", "--replicas", "2",
            "--policy", "prefix_aware", "--max-num-seqs", "32"]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["gpufleet", *args])
        main()
    out = capsys.readouterr().out
    assert "gpufleet sim (prefix_aware)" in out and "Prefix cache hit rate" in out
