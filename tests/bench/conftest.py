from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from gpufleet.bench.stub import StubBehaviour, StubServer


def start_stub_process(*args: str) -> tuple[subprocess.Popen[str], str]:
    """`python -m gpufleet.bench.stub --port 0 ARGS` and its URL (read from its first line)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.bench.stub", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"stub did not start: {line!r}")
    return proc, line.strip().rsplit(" ", 1)[-1]


@pytest.fixture
def stub_process(request: pytest.FixtureRequest) -> Iterator[str]:
    args = getattr(request, "param", ())
    proc, url = start_stub_process(*args)
    try:
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


class InProcessStub:
    def __init__(self, server: StubServer, url: str):
        self.server = server
        self.url = url


async def start_in_process(behaviour: StubBehaviour) -> tuple[web.AppRunner, InProcessStub]:
    server = StubServer(behaviour)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, InProcessStub(server, f"http://127.0.0.1:{port}")


@pytest.fixture
async def stub() -> AsyncIterator[InProcessStub]:
    """A stub on an ephemeral port in this event loop: 2 ms to first token, 1 ms per token."""
    runner, s = await start_in_process(StubBehaviour(ttft_s=0.002, itl_s=0.001))
    try:
        yield s
    finally:
        await runner.cleanup()
