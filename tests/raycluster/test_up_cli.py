"""`gpufleet up --backend ray` as a user runs it, against the session's local Ray cluster:
one controller per fleet name, and an `up` killed without cleanup has its replicas adopted
(not started twice) by the next one, which removes them all on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import NAMESPACE, RayCluster

pytestmark = [pytest.mark.ray, pytest.mark.process, pytest.mark.timeout(300)]

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))

FLEET = f"""
replicas:
  startup_s: 0.2
  tp: 2
autoscale:
  min_replicas: 2
  max_replicas: 2
gateway:
  admin_key: test-admin
backend:
  kind: ray
  namespace: {NAMESPACE}
  cpus_per_bundle: 0.5
"""


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


def _replicas(url: str) -> list[dict]:
    req = urllib.request.Request(
        f"{url}/admin/autoscale", headers={"Authorization": "Bearer test-admin"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        data: dict = json.loads(resp.read())
    return list(data["replicas"])


def _argv(cfg: Path, address: str) -> list[str]:
    flags = ["--port", "0", "--backend", "ray", "--ray-address", address]
    return [GPUFLEET, "up", str(cfg), *flags, "--fleet-name", "t-cli"]


def _up(cfg: Path, address: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _argv(cfg, address),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _ready_pids(proc: subprocess.Popen[str]) -> dict[str, int]:
    assert proc.stdout is not None
    m = re.search(r"gateway on (http://127\.0\.0\.1:\d+)", proc.stdout.readline())
    assert m, "no gateway line"
    deadline = time.monotonic() + 120  # hang guard
    while True:
        reps = _replicas(m.group(1))
        if len(reps) == 2 and all(r["state"] == "ready" for r in reps):
            return {r["id"]: r["pid"] for r in reps}
        assert time.monotonic() < deadline, reps
        time.sleep(0.3)


def test_one_controller_per_fleet_adoption_and_clean_stop(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(FLEET)
    first = _up(cfg, ray_cluster.address)
    procs = [first]
    pids: dict[str, int] = {}
    try:
        pids = _ready_pids(first)
        second = subprocess.run(
            _argv(cfg, ray_cluster.address),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"already has a controller: gpufleet up pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr

        first.kill()  # no cleanup at all: the replicas stay, the lock goes with it
        first.wait(timeout=10)
        assert all(_alive(p) for p in pids.values())
        third = _up(cfg, ray_cluster.address)
        procs.append(third)
        assert _ready_pids(third) == pids  # adopted: same processes, none started twice

        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=60) == 0
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids.values()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        import ray

        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        assert not [n for n in names if n.startswith("t-cli/")], names
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for pid in pids.values():
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
