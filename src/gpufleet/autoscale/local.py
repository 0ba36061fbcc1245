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
import logging
import os
import shlex
import shutil
import signal
import socket
import string
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gpufleet.autoscale.actuator import FleetRegistry, ManagedReplica
from gpufleet.autoscale.lifecycle import ActuatorBase, Entry
from gpufleet.errors import UserError
from gpufleet.routing.types import ReplicaState

log = logging.getLogger("gpufleet.autoscale")

DEFAULT_COMMAND = (
    "{gpufleet} replica --model {model} --gpu {gpu} --tp {tp} --pp {pp} --host {host} --port {port} "
    "--startup-s {startup_s} --time-scale {time_scale}"
)
TEMPLATE_FIELDS = frozenset(
    {
        "gpufleet",
        "python",
        "model",
        "gpu",
        "tp",
        "pp",
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


def die_with_parent() -> None:
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
class _Proc(Entry):
    port: int = 0
    process: asyncio.subprocess.Process | None = None


class LocalProcessActuator(ActuatorBase[_Proc]):
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
            "pp": 1,
            "startup_s": 0,
            "time_scale": 1.0,
        }
        self.values.update(values or {})
        super().__init__(
            registry=registry,
            expected_startup_s=expected_startup_s,
            health_timeout_s=health_timeout_s,
            drain_deadline_s=drain_deadline_s,
            stop_grace_s=stop_grace_s,
            restart_crashed=restart_crashed,
            clock=clock,
            id_prefix=id_prefix,
        )
        self.host = host
        self.log_dir = log_dir

    # -- Actuator ---------------------------------------------------------------------
    async def start(self, n: int) -> list[ManagedReplica]:
        started = []
        for _ in range(n):
            port = free_port(self.host)
            replica = self._new_replica(f"http://{self.host}:{port}")
            proc = _Proc(replica, port=port)
            self._entries[replica.replica_id] = proc
            await self._spawn(proc)
            started.append(replica)
        return started

    async def _halt(self, proc: _Proc) -> None:
        await self._terminate(proc)

    # -- internals --------------------------------------------------------------------
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
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
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
        replica = proc.replica
        took_s = self._mark_ready(replica)
        try:
            await self.registry.add(replica.replica_id, replica.url)
        except Exception:  # the gateway refused or is unreachable: say so, keep the replica
            log.exception("could not register %s with the gateway", replica.replica_id)
            return
        log.info("%s ready after %.1f s", replica.replica_id, took_s)

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
            self._entries.pop(replica.replica_id, None)
            return
        await asyncio.sleep(self._restarting(replica))
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
