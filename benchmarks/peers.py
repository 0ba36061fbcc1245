"""Peers to measure against, each installed from PyPI into its own venv outside the project.

`peer_bin("sglang-router", ["sglang-router"], "python")` returns the path of a program in
that peer's venv, creating the venv on first use. The venvs live under
$GPUFLEET_PEERS_DIR (default ~/.cache/gpufleet/peers), never inside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PEERS_DIR = Path(
    os.environ.get("GPUFLEET_PEERS_DIR", Path.home() / ".cache" / "gpufleet" / "peers")
)


def peer_venv(name: str, packages: list[str]) -> Path:
    """The venv directory of peer `name`, with `packages` installed (created on first use)."""
    venv = PEERS_DIR / name
    stamp = venv / ".installed"
    wanted = "\n".join(sorted(packages))
    if stamp.exists() and stamp.read_text() == wanted:
        return venv
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *packages], check=True)
    stamp.write_text(wanted)
    return venv


def peer_bin(name: str, packages: list[str], program: str) -> Path:
    return peer_venv(name, packages) / "bin" / program
