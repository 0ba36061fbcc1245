"""The Ray backend of `gpufleet up --backend ray`: connect, hold the fleet's lock, actuate.

Ray is an extra (`pip install 'gpufleet[ray]'`); nothing here imports it until asked, and
asking without it installed is a `UserError` that says how to install it. One controller
per fleet: a named lock actor "{fleet}/controller" owned by the `up` process (Ray removes
it when that process dies, so a crashed `up` never blocks the next one); a second `up` for
the same fleet refuses, naming the first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpufleet.autoscale.raycluster.shape import CONTROLLER_SUFFIX, ReplicaShape
from gpufleet.errors import UserError

if TYPE_CHECKING:
    from gpufleet.autoscale.raycluster.actuator import RayActuator

__all__ = ["ReplicaShape", "acquire_lock", "connect", "ray_actuator", "require_ray"]

INSTALL_FIX = "pip install 'gpufleet[ray]'"

# A local address (127.0.0.1) stays on loopback instead of being rewritten to the host's
# first external address. Ray reads this once, when it is first imported: so here, before
# any module of this package imports it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def require_ray(field: str = "backend.kind") -> ModuleType:
    try:
        import ray
    except ImportError:
        raise UserError("the Ray backend needs Ray", field=field, fix=INSTALL_FIX) from None
    return ray


def connect(
    address: str | None, namespace: str, *, local_gpus: int, local_cpus: int | None = None
) -> bool:
    """Connect to the cluster at `address` ('auto', 'ray://HOST:10001', 'HOST:PORT'), or with
    None start a local cluster of its own declaring `local_gpus` GPUs (none need exist).
    True when this call connected (the caller disconnects); False when already connected."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    with _keep_signal_handlers():
        _init(ray, address, namespace, local_gpus, local_cpus, quiet)
    return True


@contextlib.contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """Ray's core worker installs its own SIGTERM/SIGINT handlers (which abort the process);
    the caller's (`up` stops everything cleanly on them) are put back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in saved.items():
                if handler is not None:
                    signal.signal(sig, handler)


def _init(
    ray: ModuleType,
    address: str | None,
    namespace: str,
    local_gpus: int,
    local_cpus: int | None,
    quiet: dict[str, Any],
) -> None:
    if address is None:
        ray.init(
            namespace=namespace,
            num_gpus=local_gpus,
            num_cpus=local_cpus,
            include_dashboard=False,
            object_store_memory=100 * 1024 * 1024,
            _node_ip_address="127.0.0.1",
            **quiet,
        )
    else:
        try:
            ray.init(address=address, namespace=namespace, **quiet)
        except ConnectionError as e:
            raise UserError(
                f"cannot reach a Ray cluster at {address!r}: {e}",
                field="--ray-address",
                fix="start one (`ray start --head`), or pass its address (ray://HOST:10001)",
            ) from None


def acquire_lock(fleet: str, namespace: str) -> Any:
    """The fleet's lock actor; a clear UserError when another `up` holds it."""
    ray = require_ray()
    from gpufleet.autoscale.raycluster.host import FleetLock

    name = fleet + CONTROLLER_SUFFIX
    owner = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    try:
        return (
            ray.remote(FleetLock).options(name=name, namespace=namespace, num_cpus=0).remote(owner)
        )
    except ValueError:
        holder: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            holder = ray.get(ray.get_actor(name, namespace=namespace).holder.remote(), timeout=10)
        who = (
            f"gpufleet up pid {holder['pid']} on {holder['host']} since {holder['since']}"
            if holder
            else "another gpufleet up"
        )
        raise UserError(
            f"fleet {fleet!r} (namespace {namespace!r}) already has a controller: {who}",
            field="--fleet-name",
            fix="stop that one first (the next `up` adopts its replicas), or pick another "
            "--fleet-name",
        ) from None


@contextlib.asynccontextmanager
async def ray_actuator(
    command: str,
    *,
    address: str | None,
    namespace: str,
    fleet: str,
    shape: ReplicaShape,
    local_gpus: int,
    local_cpus: int | None = None,
    **options: Any,
) -> AsyncIterator[RayActuator]:
    """Connected, locked and adopted; on exit every replica stopped and the lock released."""
    ray = require_ray()
    connected_here = connect(address, namespace, local_gpus=local_gpus, local_cpus=local_cpus)
    lock = None
    try:
        lock = acquire_lock(fleet, namespace)
        from gpufleet.autoscale.raycluster.actuator import RayActuator

        actuator = RayActuator(command, shape=shape, fleet=fleet, namespace=namespace, **options)
        try:
            adopted = await actuator.adopt()
            if adopted:
                logging.getLogger("gpufleet.autoscale").warning(
                    "adopted %d running replica(s) of fleet %r", len(adopted), fleet
                )
            yield actuator
        finally:
            await actuator.close()
    finally:
        if lock is not None:
            with contextlib.suppress(Exception):
                ray.kill(lock)
        if connected_here:
            ray.shutdown()
