"""Run reports: three labelled PNGs and one self-contained HTML page (needs matplotlib)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.report import Decision, RequestPoint, RunRecord, write_report

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"


def test_write_report_files(tmp_path: Path) -> None:
    record = RunRecord(
        title="demo",
        requests=[RequestPoint(i * 0.5, i % 7 != 0, 0.02 + i / 1e3, 0.01, 0.5) for i in range(80)],
        replicas=[(0.0, 1), (10.0, 3), (30.0, 2)],
        ready=[(0.0, 1), (18.0, 3), (30.0, 2)],
        decisions=[Decision(10.0, 1, 3, "queue grew"), Decision(30.0, 3, 2, "idle")],
        summary={"requests": 80, "ttft_p99_s": 0.1},
    )
    paths = write_report(record, tmp_path / "r")
    names = sorted(p.name for p in paths)
    assert names == ["index.html", "latency_cdf.png", "latency_time.png", "replicas_load.png"]
    for p in paths[:3]:
        assert p.read_bytes().startswith(PNG) and p.stat().st_size > 10_000
    page = (tmp_path / "r" / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing outside the file
    assert "queue grew" in page and "ttft_p99_s" in page


def test_empty_run_still_draws(tmp_path: Path) -> None:
    paths = write_report(RunRecord(title="idle", replicas=[(0.0, 1), (5.0, 1)]), tmp_path)
    assert all(p.exists() for p in paths)


@pytest.mark.process
def test_sim_report_cli(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    r = subprocess.run(
        [sys.executable, "-c", "from gpufleet.cli import main; main()", "sim",
         "--rate", "20", "--num-requests", "60", "--input-tokens", "100", "--output-tokens", "10",
         "--report", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (out / "index.html").exists() and (out / "replicas_load.png").exists()
    assert f"wrote {out / 'index.html'}" in r.stdout
