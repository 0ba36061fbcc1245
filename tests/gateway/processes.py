"""Backend processes for integration tests: started on loopback, always killed afterwards."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys

import aiohttp

REPLICA_MODEL = "meta-llama/Llama-3.1-8B"
_CLI = "import sys; from gpufleet.cli import main; sys.argv[0] = 'gpufleet'; main()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BackendProcess:
    """One backend server process on a fixed port, so a restart comes back at the same URL."""

    def __init__(self, argv: list[str], port: int) -> None:
        self.argv = argv
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    async def wait_healthy(self, timeout_s: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with aiohttp.ClientSession() as s:
            while loop.time() < deadline:
                assert self.proc is not None and self.proc.poll() is None, "backend exited"
                try:
                    async with s.get(self.url + "/health") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError(f"{self.argv} not healthy before the hang-guard timeout")

    def kill(self) -> None:
        """SIGKILL, as a crashed replica."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


def replica_process(port: int, step_s: float = 0.01) -> BackendProcess:
    """A real `gpufleet replica` on a fixed port (so a restart returns at the same URL)."""
    argv = [sys.executable, "-c", _CLI, "replica", "--model", REPLICA_MODEL,
            "--port", str(port), "--step-time", f"base_s={step_s}"]  # fmt: skip
    return BackendProcess(argv, port)
