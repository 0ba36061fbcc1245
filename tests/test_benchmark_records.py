"""Benchmark results record where they came from, and peers run at pinned versions."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
HELPERS = (
    "live_client",
    "live_probes",
    "peers",
    "plan_accuracy_md",
    "plan_refits",
    "plan_rows_cli",
    "plan_sweep_checks",
    "record",
    "routing_workloads",
)  # modules benchmarks import, not benchmarks
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.stem not in HELPERS)


@pytest.mark.process  # record asks git for the commit
def test_a_result_carries_date_commit_machine_and_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import record

    json_path, md_path = record.write_result(
        tmp_path / "thing", {"rows": [1, 2]}, "| a |\n| --- |\n| 1 |", peers=["aiperf"]
    )
    data = json.loads(json_path.read_text())
    meta = data["meta"]
    assert data["rows"] == [1, 2]
    assert meta["date"][:2] == "20" and len(meta["commit"].split("-")[0]) == 40
    assert meta["machine"]["cpus"] >= 1 and meta["peers"] == {"aiperf": "0.13.0"}
    first, _, table = md_path.read_text().partition("\n\n")
    assert meta["commit"][:12] in first and "aiperf 0.13.0" in first
    assert table.startswith("| a |")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_writes_through_record(script: Path) -> None:
    tree = ast.parse(script.read_text())
    names = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             for a in n.names}  # fmt: skip
    # directly, or through the measured-row benchmarks' shared end, which writes with it
    assert ("record", "write_result") in names or ("plan_rows_cli", "write_report") in names, (
        f"{script.name} must write its results with record.write_result"
    )


def test_the_shared_report_end_writes_through_record() -> None:
    tree = ast.parse((BENCHMARKS / "plan_rows_cli.py").read_text())
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)
             if isinstance(n.func, ast.Name)}  # fmt: skip
    assert "write_result" in calls


def test_every_peer_is_started_at_its_pinned_version() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from peers import PEER_VERSIONS, pinned
    finally:
        sys.path.remove(str(BENCHMARKS))
    for name, version in PEER_VERSIONS.items():
        assert pinned(name) == [f"{name}=={version}"]
    with pytest.raises(KeyError, match="pinned"):
        pinned("some-router")
    for script in SCRIPTS:
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "peer_bin":
                first = node.args[0]
                if isinstance(first, ast.Constant):  # a literal name must be a pinned peer
                    assert first.value in PEER_VERSIONS, (script.name, first.value)
