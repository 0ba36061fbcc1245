"""`gpufleet gateway` as a process: flags, config errors, serving, SIGHUP reload, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from .processes import REPLICA_MODEL, BackendProcess, free_port, replica_process

pytestmark = pytest.mark.process  # every test here starts processes or servers

GPUFLEET = [sys.executable, "-c", "from gpufleet.cli import main; main()"]


def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"limits": {"max_body_bytes": -1}}))
    proc = subprocess.run(
        [*GPUFLEET, "gateway", "--config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "limits.max_body_bytes" in proc.stderr and "fix:" in proc.stderr
    proc = subprocess.run(
        [*GPUFLEET, "gateway", "--replica", "localhost:1"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "replicas[0].url" in proc.stderr


@pytest.fixture
async def backend() -> AsyncIterator[BackendProcess]:
    b = replica_process(free_port(), step_s=0.001)
    try:
        b.start()
        await b.wait_healthy()
        yield b
    finally:
        b.kill()


async def test_gateway_process_serves_and_reloads(backend: BackendProcess, tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"reload_interval_s": 0, "health": {"probe_interval_s": 0.1}}))
    proc = subprocess.Popen(
        [*GPUFLEET, "gateway", "--config", str(path), "--port", str(port), "--admin-key", "k",
         "--policy", "least_outstanding"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert url.encode() in line
        # SIGHUP re-reads the file: the replica written into it joins.
        path.write_text(yaml.safe_dump({"replicas": [{"url": backend.url, "id": "b"}],
                                        "health": {"probe_interval_s": 0.1}}))  # fmt: skip
        os.kill(proc.pid, signal.SIGHUP)
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer k"}) as s:
            states: list[str] = []

            async def poll() -> None:
                async with s.get(url + "/admin/replicas") as resp:
                    states[:] = [r["state"] for r in (await resp.json())["replicas"]]

            async def ready() -> bool:
                await poll()
                return states == ["ready"]

            for _ in range(600):
                if await ready():
                    break
                await asyncio.sleep(0.05)
            assert states == ["ready"]
            body = {"model": REPLICA_MODEL, "prompt": "x y z", "max_tokens": 3}
            async with s.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                answer = await resp.json()
                assert answer["usage"]["completion_tokens"] == 3
                assert len(answer["choices"][0]["text"].split()) == 3
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
