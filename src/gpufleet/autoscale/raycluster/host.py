"""`ReplicaHost`: the Ray actor that runs one replica's command on the node Ray chose.

It sits in bundle 0 of the replica's placement group holding the stage's GPUs, so Ray has
set CUDA_VISIBLE_DEVICES to exactly those; the command (the local backend's template)
runs as its child in its own process group, on a free port of this node, and dies with
the actor (PR_SET_PDEATHSIG). The actuator awaits `wait_exit` to learn of a crash, and
reads a restarted controller's fleet back through `describe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.autoscale.local import die_with_parent, free_port, gpufleet_program


class ReplicaHost:
    def __init__(self, replica_id: str, fleet: str, generation: int) -> None:
        self.replica_id = replica_id
        self.fleet = fleet
        self.generation = generation
        self.process: asyncio.subprocess.Process | None = None
        self.info: dict[str, Any] = {}

    async def launch(
        self, command: str, values: dict[str, Any], log_dir: str | None = None
    ) -> dict[str, Any]:
        """Start the command on a free port of this node; its address and its GPUs."""
        import ray

        ip = ray.util.get_node_ip_address()
        port = free_port(ip)
        filled = {"gpufleet": gpufleet_program(), "python": sys.executable, **values}
        filled.update(host=ip, port=port, replica_id=self.replica_id)
        argv = shlex.split(command.format(**filled))
        logs = Path(log_dir or Path(tempfile.gettempdir()) / "gpufleet-ray" / self.fleet)
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{self.replica_id}.{self.generation}.log"
        ctx = ray.get_runtime_context()
        env = dict(os.environ)
        pg = ctx.get_placement_group_id()
        env["GPUFLEET_REPLICA_ID"] = self.replica_id
        env["GPUFLEET_PLACEMENT_GROUP_ID"] = pg or ""
        with open(log_path, "ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        self.info = {
            "replica_id": self.replica_id,
            "generation": self.generation,
            "url": f"http://{ip}:{port}",
            "node_ip": ip,
            "node_id": ctx.get_node_id(),
            "port": port,
            "pid": self.process.pid,
            "host_pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "placement_group_id": pg,
            "log_path": str(log_path),
            "started_wall_s": time.time(),
        }
        return self.info

    async def wait_exit(self) -> int:
        """Returns the command's exit status when it exits."""
        assert self.process is not None, "launch first"
        return await self.process.wait()

    async def describe(self) -> dict[str, Any]:
        running = self.process is not None and self.process.returncode is None
        return {**self.info, "running": running}

    async def log_tail(self, lines: int = 5) -> str:
        try:
            text = Path(self.info["log_path"]).read_text(errors="replace")
        except (KeyError, OSError):
            return ""
        return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """SIGTERM the command's process group; SIGKILL what is left after `grace_s`."""
        proc = self.process
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


class FleetLock:
    """Held by the one controller of a fleet; owned by its `up` process, so it dies with it."""

    def __init__(self, owner: dict[str, Any]) -> None:
        self.owner = owner

    def holder(self) -> dict[str, Any]:
        return self.owner
