"""LocalProcessActuator against real processes on 127.0.0.1 (a tiny server: any command works)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gpufleet.autoscale.local import LocalProcessActuator, check_template
from gpufleet.errors import UserError
from gpufleet.routing.types import ReplicaState

TINY = Path(__file__).with_name("tiny_server.py")
COMMAND = f"{sys.executable} {TINY} --port {{port}} --startup-s {{startup_s}}"


def _stat(pid: str) -> tuple[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])  # state, process group


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as gone)."""
    st = _stat(str(pid))
    return st is not None and st[0] != "Z"


def group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(entry)
            if st is not None and st[1] == pgid and st[0] != "Z":
                out.append(int(entry))
    return out


async def wait_for(cond, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """Hang guard only: polls a condition, fails after a generous timeout."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met before the hang guard")
        await asyncio.sleep(0.05)


class Recorder:
    """A FleetRegistry that records calls (stands in for the gateway; tested separately)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def add(self, replica_id: str, url: str) -> None:
        self.calls.append(("add", replica_id))

    async def drain(self, replica_id: str) -> None:
        self.calls.append(("drain", replica_id))

    async def undrain(self, replica_id: str) -> None:
        self.calls.append(("undrain", replica_id))

    async def remove(self, replica_id: str) -> None:
        self.calls.append(("remove", replica_id))

    async def in_flight(self, replica_id: str) -> int | None:
        return None  # the engine's own /metrics tells the actuator what is left


@pytest.fixture
async def actuator(tmp_path: Path) -> AsyncIterator[LocalProcessActuator]:
    act = LocalProcessActuator(
        COMMAND,
        values={"startup_s": 0.3},
        registry=Recorder(),
        expected_startup_s=5.0,
        drain_deadline_s=15.0,
        stop_grace_s=5.0,
        log_dir=tmp_path / "logs",
    )
    try:
        yield act
    finally:
        await act.close()


@pytest.mark.process
async def test_start_waits_for_health_then_registers(actuator: LocalProcessActuator) -> None:
    [r] = await actuator.start(1)
    assert r.state == ReplicaState.STARTING
    assert r.expected_ready_s == pytest.approx(r.started_at_s + 5.0)
    await wait_for(lambda: r.state == ReplicaState.READY)
    rec = actuator.registry
    assert isinstance(rec, Recorder)
    assert rec.calls == [("add", r.replica_id)]
    cold = actuator.observed_cold_start_s()
    assert cold is not None and cold >= 0.3
    async with aiohttp.ClientSession() as s, s.get(f"{r.url}/health") as resp:
        assert resp.status == 200


@pytest.mark.process
async def test_drain_lets_in_flight_finish_then_stops(actuator: LocalProcessActuator) -> None:
    [r] = await actuator.start(1)
    await wait_for(lambda: r.state == ReplicaState.READY)
    assert r.pid is not None
    pid = r.pid
    async with aiohttp.ClientSession() as s:
        req = asyncio.create_task(s.post(f"{r.url}/v1/completions", json={"hold_s": 1.5}))
        await asyncio.sleep(0.3)  # let the request reach the server
        await actuator.drain(r.replica_id)
        assert r.state == ReplicaState.DRAINING
        resp = await req  # the held request completes: the drain waited for it
        assert resp.status == 200
        assert (await resp.json())["pid"] == pid
    await wait_for(lambda: not actuator.list())
    await wait_for(lambda: not alive(pid))
    assert r.cut_requests == 0
    rec = actuator.registry
    assert isinstance(rec, Recorder)
    assert [c for c, _ in rec.calls] == ["add", "drain", "remove"]


@pytest.mark.process
async def test_undrain_takes_a_draining_replica_back_warm(actuator: LocalProcessActuator) -> None:
    [r] = await actuator.start(1)
    await wait_for(lambda: r.state == ReplicaState.READY)
    pid = r.pid
    async with aiohttp.ClientSession() as s:
        req = asyncio.create_task(s.post(f"{r.url}/v1/completions", json={"hold_s": 1.0}))
        await asyncio.sleep(0.3)  # let the request reach the server: the drain waits for it
        await actuator.drain(r.replica_id)
        assert r.state == ReplicaState.DRAINING
        assert await actuator.undrain(r.replica_id)
        assert r.state == ReplicaState.READY and actuator.undrained_total == 1
        assert (await req).status == 200
        # The cancelled drain does not stop it once its request is done: the same process
        # serves on, with no new cold start.
        await asyncio.sleep(1.0)
        assert actuator.list() == [r] and alive(pid or 0)
        async with s.post(f"{r.url}/v1/completions", json={}) as resp:
            assert (await resp.json())["pid"] == pid
    assert not await actuator.undrain(r.replica_id)  # ready: nothing to take back
    rec = actuator.registry
    assert isinstance(rec, Recorder)
    assert [c for c, _ in rec.calls] == ["add", "drain", "undrain"]
    assert len(actuator._cold_starts_s) == 1


@pytest.mark.process
async def test_crashed_replica_is_restarted_on_its_port(actuator: LocalProcessActuator) -> None:
    [r] = await actuator.start(1)
    await wait_for(lambda: r.state == ReplicaState.READY)
    first_pid, url = r.pid, r.url
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            await s.post(f"{r.url}/exit")
    seen: set[ReplicaState] = set()

    def restarted() -> bool:
        seen.add(r.state)
        return r.restarts == 1 and r.state == ReplicaState.READY

    await wait_for(restarted)
    # Between the crash and the restart it counts as starting, never as gone: the
    # controller must not start another replica in its place.
    assert ReplicaState.STARTING in seen and ReplicaState.DEAD not in seen
    assert r.pid != first_pid and r.url == url
    rec = actuator.registry
    assert isinstance(rec, Recorder)
    assert ("remove", r.replica_id) in rec.calls
    assert rec.calls.count(("add", r.replica_id)) == 2


@pytest.mark.process
async def test_close_leaves_no_process_even_grandchildren(tmp_path: Path) -> None:
    # A shell that starts the server as its child: stopping must take the whole group.
    act = LocalProcessActuator(
        f"sh -c '{sys.executable} {TINY} --port {{port}} & wait'", stop_grace_s=5.0
    )
    try:
        [r] = await act.start(1)
        await wait_for(lambda: r.state == ReplicaState.READY)
        assert r.pid is not None
        pgid = os.getpgid(r.pid)
        assert pgid == r.pid  # its own process group
        assert len(group_alive(pgid)) == 2  # the shell and the server
    finally:
        await act.close()
    await wait_for(lambda: not group_alive(pgid))


def test_bad_templates_name_the_field() -> None:
    with pytest.raises(UserError, match=r"replicas.command.*\{modle\}"):
        check_template("vllm serve {modle} --port {port}")
    with pytest.raises(UserError, match=r"must contain \{port\}"):
        check_template("vllm serve {model}")
    check_template("vllm serve {model} --port {port} --tensor-parallel-size {tp}")


@pytest.mark.process
async def test_a_replica_that_cannot_start_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    act = LocalProcessActuator(
        "sh -c 'echo no such model on port {port} >&2; exit 2'",
        restart_crashed=False,
        log_dir=tmp_path,
    )
    try:
        with caplog.at_level("WARNING", logger="gpufleet.autoscale"):
            [r] = await act.start(1)
            await wait_for(lambda: not act.list())
    finally:
        await act.close()
    assert r.state == ReplicaState.DEAD
    assert any(
        "exited with status 2" in m and "no such model on port" in m for m in caplog.messages
    ), caplog.messages
