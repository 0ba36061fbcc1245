"""Where benchmark results go, and what each records besides its figures.

Every result a benchmark writes is a JSON file and a markdown table under
benchmarks/results/ (committed: the README quotes them), stamped with the date, the
commit it measured, the machine it ran on and the peer versions it ran beside
(`meta`). Scratch output (logs, per-run exports) goes to benchmarks/results/raw/, which
git ignores.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from peers import PEER_VERSIONS

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RAW = RESULTS / "raw"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=HERE, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * size / 2**30, 1)


def _snapshot() -> dict[str, Any]:
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit + ("-dirty" if dirty and commit else ""),
        "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


# Taken when the benchmark starts (it imports this module first): the date, commit and
# load of the run, not of the moment its results are written.
_START = _snapshot()


def run_meta(peers: Iterable[str] = (), note: str = "") -> dict[str, Any]:
    """Date, commit, machine and peer versions of a benchmark run (as it started)."""
    return {
        "date": _START["date"],
        "commit": _START["commit"],
        "machine": {
            "cpu": _cpu_model(),
            "cpus": os.cpu_count(),
            "memory_gib": _memory_gib(),
            "load_1min_at_start": _START["load"],
            "os": platform.platform(),
            "python": platform.python_version(),
        },
        "peers": {name: PEER_VERSIONS[name] for name in peers},
        "note": note,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def stamp(meta: dict[str, Any]) -> str:
    """The line a markdown result starts with."""
    m = meta["machine"]
    peers = ", ".join(f"{k} {v}" for k, v in meta["peers"].items())
    parts = [
        meta["date"][:10],
        f"commit {meta['commit'][:12] or 'unknown'}"
        + (" (uncommitted changes)" if meta["commit"].endswith("-dirty") else ""),
        f"{m['cpus']} × {m['cpu']}, {m['memory_gib']} GiB, load {m['load_1min_at_start']:.1f}",
        f"`{meta['command']}`",
    ]
    if peers:
        parts.append(f"peers: {peers}")
    if meta["note"]:
        parts.append(meta["note"])
    return "_" + " · ".join(parts) + "_"


def write_result(
    stem: Path | str,
    data: dict[str, Any],
    table: str,
    *,
    peers: Iterable[str] = (),
    note: str = "",
) -> tuple[Path, Path]:
    """Write `stem`.json (data + meta) and `stem`.md (stamp + table); a bare name goes
    under benchmarks/results/. Returns both paths."""
    path = Path(stem)
    if not path.is_absolute() and path.parent == Path("."):
        path = RESULTS / path
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = run_meta(peers, note)
    json_path, md_path = path.with_suffix(".json"), path.with_suffix(".md")
    json_path.write_text(json.dumps({"meta": meta, **data}, indent=2, default=str) + "\n")
    md_path.write_text(stamp(meta) + "\n\n" + table.rstrip("\n") + "\n")
    return json_path, md_path
