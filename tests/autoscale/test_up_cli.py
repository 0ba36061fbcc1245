"""`gpufleet up` as a user runs it: a real process tree, stopped by SIGTERM or Ctrl-C (SIGINT),
leaving no process behind; and bad configs rejected before anything starts."""

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

pytestmark = pytest.mark.process  # every test here starts processes or servers

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))

FLEET = """
replicas:
  startup_s: 0.5
autoscale:
  min_replicas: 2
  max_replicas: 3
gateway:
  admin_key: test-admin
"""


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"  # a zombie awaiting init counts as gone


def _autoscale(url: str) -> dict:
    req = urllib.request.Request(
        f"{url}/admin/autoscale", headers={"Authorization": "Bearer test-admin"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        data: dict = json.loads(resp.read())
        return data


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_up_stops_everything_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(FLEET)
    proc = subprocess.Popen(
        [GPUFLEET, "up", str(cfg), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so the test can clean up the whole tree if it fails
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"gateway on (http://127\.0\.0\.1:\d+)", line)
        assert m, line
        url = m.group(1)
        deadline = time.monotonic() + 60  # hang guard
        while True:
            state = _autoscale(url)
            ready = [r for r in state["replicas"] if r["state"] == "ready"]
            if len(ready) == 2:
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        pids = [r["pid"] for r in state["replicas"]]
        assert all(_alive(p) for p in pids)
        assert state["policy"] == "default"

        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids):
            assert time.monotonic() < deadline, [p for p in pids if _alive(p)]
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_up_rejects_a_bad_config_before_starting(tmp_path: Path) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("autoscale:\n  policy: hpa\n  params: {tolerence: 0.1}\n")
    out = subprocess.run(
        [GPUFLEET, "up", str(cfg), "--port", "0"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "autoscale.params.tolerence" in out.stderr and "fix:" in out.stderr
    assert "Traceback" not in out.stderr


def test_replicas_die_with_a_killed_up(tmp_path: Path) -> None:
    # SIGKILL gives `up` no chance to clean up: replicas must still not outlive it.
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(FLEET)
    proc = subprocess.Popen(
        [GPUFLEET, "up", str(cfg), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        m = re.search(r"gateway on (http://127\.0\.0\.1:\d+)", proc.stdout.readline())
        assert m
        deadline = time.monotonic() + 60
        while len(pids) < 2:
            pids = [r["pid"] for r in _autoscale(m.group(1))["replicas"] if r["pid"]]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids):
            assert time.monotonic() < deadline, [p for p in pids if _alive(p)]
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in pids:  # never leave a replica behind, even when the assertion failed
            if _alive(p):
                os.killpg(p, signal.SIGKILL)


def test_single_group_flags_refuse_a_groups_yaml_and_deploy_takes_it(tmp_path: Path) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("groups:\n  - replicas: {model: Qwen/Qwen3-8B}\n")
    argv = ["up", str(cfg), "--policy", "hpa", "--port", "0"]  # --policy is one group's
    out = subprocess.run([GPUFLEET, *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "groups:" in out.stderr and "fix:" in out.stderr and "Traceback" not in out.stderr
    argv = ["deploy", "k8s", str(cfg), "-o", str(tmp_path / "out")]  # one workload per group
    out = subprocess.run([GPUFLEET, *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert any(p.name.startswith("20-") for p in (tmp_path / "out").iterdir())
