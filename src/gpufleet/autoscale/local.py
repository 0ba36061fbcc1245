"""`LocalProcessActuator`: replicas as local processes started from a command template.

Any OpenAI-compatible server works: the default runs `gpufleet replica`, and e.g.
`vllm serve {model} --port {port} --tensor-parallel-size {tp}` runs the real thing. Each
replica gets its own process group (so stopping it stops whatever it spawned), a free
port, and a log file. It is `starting` until its /health answers 200, then registered
with the gateway; draining stops new requests at the gateway, waits for in-flight ones
(up to a deadline), then removes and stops it. A replica that exits on its own is removed
from the gateway and restarted on the same port, with backoff.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import os
import shlex
import shutil
import signal
import socket
import string
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from gpufleet.autoscale.actuator import (
    FleetRegistry,
    ManagedReplica,
    NoRegistry,
    restart_backoff_s,
)
from gpufleet.errors import UserError
from gpufleet.routing.types import ReplicaState

log = logging.getLogger("gpufleet.autoscale")

DEFAULT_COMMAND = (
    "{gpufleet} replica --model {model} --gpu {gpu} --tp {tp} --host {host} --port {port} "
    "--startup-s {startup_s} --time-scale {time_scale}"
)
TEMPLATE_FIELDS = frozenset(
    {
        "gpufleet",
        "python",
        "model",
        "gpu",
        "tp",
        "host",
        "port",
        "replica_id",
        "startup_s",
        "time_scale",
    }
)


def gpufleet_program() -> str:
    """The `gpufleet` script of this interpreter's environment (or the one on PATH)."""
    here = Path(sys.executable).parent / "gpufleet"
    if here.exists():
        return str(here)
    return shutil.which("gpufleet") or "gpufleet"


def check_template(command: str) -> None:
    """Reject unknown {placeholders} before any process starts."""
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(command) if f is not None}
    except ValueError as e:
        raise UserError(str(e), field="replicas.command", fix="balance the { } braces") from None
    unknown = sorted(n for n in names if n not in TEMPLATE_FIELDS)
    if unknown:
        raise UserError(
            f"unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)}",
            field="replicas.command",
            fix=f"use only {', '.join('{' + n + '}' for n in sorted(TEMPLATE_FIELDS))}",
        )
    if "{port}" not in command:
        raise UserError(
            "the command must contain {port}", field="replicas.command", fix="add --port {port}"
        )


def _die_with_parent() -> None:
    """In the child before exec (Linux): get SIGTERM if the controller dies, even by SIGKILL.

    A clean stop goes through process groups; this covers the unclean one.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(slots=True)
class _Proc:
    replica: ManagedReplica
    port: int
    process: asyncio.subprocess.Process | None = None
    stopping: bool = False
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class LocalProcessActuator:
    def __init__(
        self,
        command: str = DEFAULT_COMMAND,
        *,
        values: Mapping[str, object] | None = None,
        registry: FleetRegistry | None = None,
        host: str = "127.0.0.1",
        expected_startup_s: float = 30.0,
        health_timeout_s: float = 600.0,
        drain_deadline_s: float = 60.0,
        stop_grace_s: float = 10.0,
        restart_crashed: bool = True,
        log_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        id_prefix: str = "replica",
    ) -> None:
        check_template(command)
        self.command = command
        self.values: dict[str, object] = {
            "gpufleet": gpufleet_program(),
            "python": sys.executable,
            "model": "meta-llama/Llama-3.1-8B",
            "gpu": "h100-sxm",
            "tp": 1,
            "startup_s": 0,
            "time_scale": 1.0,
        }
        self.values.update(values or {})
        self.registry: FleetRegistry = registry or NoRegistry()
        self.host = host
        self.expected_startup_s = expected_startup_s
        self.health_timeout_s = health_timeout_s
        self.drain_deadline_s = drain_deadline_s
        self.stop_grace_s = stop_grace_s
        self.restart_crashed = restart_crashed
        self.log_dir = log_dir
        self.clock = clock
        self._ids = (f"{id_prefix}-{i}" for i in itertools.count(1))
        self._procs: dict[str, _Proc] = {}
        self._cold_starts_s: deque[float] = deque(maxlen=8)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self.cut_requests_total = 0  # in flight when a drain deadline forced a stop

    # -- Actuator ---------------------------------------------------------------------
    async def start(self, n: int) -> list[ManagedReplica]:
        started = []
        for _ in range(n):
            replica_id = next(self._ids)
            port = free_port(self.host)
            now = self.clock()
            replica = ManagedReplica(
                replica_id,
                f"http://{self.host}:{port}",
                ReplicaState.STARTING,
                started_at_s=now,
                expected_ready_s=now + self._expected_startup(),
            )
            proc = _Proc(replica, port)
            self._procs[replica_id] = proc
            await self._spawn(proc)
            started.append(replica)
        return started

    async def drain(self, replica_id: str) -> None:
        proc = self._procs.get(replica_id)
        if proc is None or proc.stopping:
            return
        if proc.replica.state == ReplicaState.STARTING:
            await self.stop(replica_id)  # never served: nothing to drain
            return
        proc.replica.state = ReplicaState.DRAINING
        with contextlib.suppress(KeyError):
            await self.registry.drain(replica_id)
        self._background(proc, self._finish_drain(proc))

    async def stop(self, replica_id: str) -> None:
        proc = self._procs.get(replica_id)
        if proc is None:
            return
        proc.stopping = True
        with contextlib.suppress(KeyError):
            await self.registry.remove(replica_id)
        await self._terminate(proc)
        proc.replica.state = ReplicaState.DEAD
        for task in list(proc.tasks):
            if task is not asyncio.current_task():
                task.cancel()
        self._procs.pop(replica_id, None)

    def list(self) -> list[ManagedReplica]:
        return [p.replica for p in self._procs.values()]

    def observed_cold_start_s(self) -> float | None:
        if not self._cold_starts_s:
            return None
        return sum(self._cold_starts_s) / len(self._cold_starts_s)

    async def close(self) -> None:
        """Stop every replica (used on shutdown); leaves no process behind."""
        self._closed = True
        await asyncio.gather(*(self.stop(rid) for rid in list(self._procs)), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- internals --------------------------------------------------------------------
    def _expected_startup(self) -> float:
        return self.observed_cold_start_s() or self.expected_startup_s

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        return self._session

    def _argv(self, proc: _Proc) -> builtins.list[str]:
        values = dict(
            self.values, host=self.host, port=proc.port, replica_id=proc.replica.replica_id
        )
        return shlex.split(self.command.format(**values))

    async def _spawn(self, proc: _Proc) -> None:
        argv = self._argv(proc)
        out: int | object = asyncio.subprocess.DEVNULL
        log_file = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = open(self.log_dir / f"{proc.replica.replica_id}.log", "ab")  # noqa: SIM115
            out = log_file
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,  # type: ignore[arg-type]
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() kills all it spawned
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        except FileNotFoundError as e:
            raise UserError(
                f"cannot run {argv[0]!r}: {e.strerror}",
                field="replicas.command",
                fix="give the full path of the server program",
            ) from None
        finally:
            if log_file is not None:
                log_file.close()  # the child holds its own descriptor
        proc.process = process
        proc.replica.pid = process.pid
        log.info("started %s (pid %s) on port %s", proc.replica.replica_id, process.pid, proc.port)
        self._background(proc, self._await_ready(proc, process))
        self._background(proc, self._watch_exit(proc, process))

    def _background(self, proc: _Proc, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        proc.tasks.add(task)
        task.add_done_callback(proc.tasks.discard)

    async def _await_ready(self, proc: _Proc, process: asyncio.subprocess.Process) -> None:
        deadline = self.clock() + self.health_timeout_s
        url = f"{proc.replica.url}/health"
        while process.returncode is None and self.clock() < deadline:
            try:
                async with self._http().get(url) as resp:
                    if resp.status == 200:
                        break
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.2)
        else:
            if process.returncode is None:
                log.warning(
                    "%s not healthy after %.0f s: stopping it",
                    proc.replica.replica_id,
                    self.health_timeout_s,
                )
                await self._terminate(proc)
            return
        if proc.stopping:
            return  # stopped while it was loading: never registered
        now = self.clock()
        replica = proc.replica
        self._cold_starts_s.append(now - replica.started_at_s)
        replica.ready_at_s = now
        replica.state = ReplicaState.READY
        try:
            await self.registry.add(replica.replica_id, replica.url)
        except Exception:  # the gateway refused or is unreachable: say so, keep the replica
            log.exception("could not register %s with the gateway", replica.replica_id)
            return
        log.info("%s ready after %.1f s", replica.replica_id, now - replica.started_at_s)

    async def _watch_exit(self, proc: _Proc, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if proc.stopping or self._closed:
            return
        replica = proc.replica
        log.warning("%s exited with status %s%s", replica.replica_id, code, self._log_tail(replica))
        with contextlib.suppress(KeyError):
            await self.registry.remove(replica.replica_id)
        if not self.restart_crashed:
            replica.state = ReplicaState.DEAD
            self._procs.pop(replica.replica_id, None)
            return
        # It counts as starting from now on (capacity on its way), so the controller does
        # not start a second replica in its place.
        backoff_s = restart_backoff_s(replica.restarts)
        now = self.clock()
        replica.state = ReplicaState.STARTING
        replica.started_at_s = now
        replica.expected_ready_s = now + backoff_s + self._expected_startup()
        replica.ready_at_s = None
        await asyncio.sleep(backoff_s)
        if proc.stopping or self._closed:
            return
        replica.restarts += 1
        replica.started_at_s = self.clock()  # cold starts are measured from the spawn
        await self._spawn(proc)

    def _log_tail(self, replica: ManagedReplica, lines: int = 5) -> str:
        """The end of its log, so a command that cannot start says why."""
        if self.log_dir is None:
            return ""
        try:
            text = (self.log_dir / f"{replica.replica_id}.log").read_text(errors="replace")
        except OSError:
            return ""
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        return (": …\n  " + "\n  ".join(tail)) if tail else ""

    async def _finish_drain(self, proc: _Proc) -> None:
        deadline = self.clock() + self.drain_deadline_s
        left = 0
        while self.clock() < deadline:
            left = await self._requests_left(proc)
            if left == 0:
                break
            await asyncio.sleep(0.2)
        else:
            proc.replica.cut_requests += left
            self.cut_requests_total += left
            log.warning(
                "%s: drain deadline %.0f s passed with %d requests in flight",
                proc.replica.replica_id,
                self.drain_deadline_s,
                left,
            )
        log.info("%s drained", proc.replica.replica_id)
        await self.stop(proc.replica.replica_id)

    async def _requests_left(self, proc: _Proc) -> int:
        """In flight at the gateway, or running/waiting in the engine, whichever is larger."""
        gateway = await self.registry.in_flight(proc.replica.replica_id)
        engine = await self._engine_load(proc)
        return max(gateway or 0, engine or 0)

    async def _engine_load(self, proc: _Proc) -> int | None:
        from gpufleet.fleet_state import parse_engine_metrics

        try:
            async with self._http().get(f"{proc.replica.url}/metrics") as resp:
                if resp.status != 200:
                    return None
                return parse_engine_metrics(await resp.text()).load
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None

    async def _terminate(self, proc: _Proc) -> None:
        process = proc.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.stop_grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        # Anything left in the group (a child that ignored SIGTERM) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
