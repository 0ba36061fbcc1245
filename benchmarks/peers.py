"""Peers to measure against, each installed from PyPI into its own venv outside the project.

Their versions are pinned here, so a result names what it measured and a re-run installs
exactly that (`record.run_meta` writes them into every result). `peer_bin("sglang-router",
"python")` returns the path of a program in that peer's venv, creating the venv (or
re-creating it when the pin changed) on first use. The venvs live under
$GPUFLEET_PEERS_DIR (default ~/.cache/gpufleet/peers), never inside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# The versions the committed results were measured with. Change one, re-run its benchmarks.
PEER_VERSIONS: dict[str, str] = {
    "sglang-router": "0.3.2",
    "vllm-router": "0.1.17",
    "aiperf": "0.13.0",
    "vllm": "0.33.0",  # `vllm bench serve` only (bench_parity --with-vllm): a ~9 GB venv
    "vidur": "0.0.26",  # sim_speed's simulator peer (microsoft/vidur)
}

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


def pinned(name: str) -> list[str]:
    """The pip requirement of peer `name`, exactly its pinned version."""
    if name not in PEER_VERSIONS:
        raise KeyError(f"peer {name!r} has no pinned version; add it to PEER_VERSIONS")
    return [f"{name}=={PEER_VERSIONS[name]}"]


def peer_bin(name: str, program: str) -> Path:
    """`program` in the venv of peer `name`, installed at its pinned version."""
    return peer_venv(name, pinned(name)) / "bin" / program


def rust_router_argv(name: str, port: int, upstreams: list[str]) -> list[str]:
    """sglang-router or vllm-router on loopback, round robin over `upstreams`, quiet logs:
    the command every benchmark that puts a Rust router beside the gateway starts."""
    if name == "sglang-router":
        py = peer_bin("sglang-router", "python")
        return [str(py), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--policy", "round_robin", "--log-level", "error",
                "--worker-urls", *upstreams]  # fmt: skip
    if name == "vllm-router":
        exe = peer_bin("vllm-router", "vllm-router")
        return [str(exe), "--host", "127.0.0.1", "--port", str(port), "--policy",
                "round_robin", "--log-level", "error", "--worker-urls", *upstreams]  # fmt: skip
    raise ValueError(f"not a Rust router: {name!r}")
