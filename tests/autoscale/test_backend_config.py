"""The `backend:` section and the Ray flags of `gpufleet up`, the Ray extra's import guard,
and a backend's pending note in the controller's reason (pure: no cluster, no process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.autoscale.actuator import ManagedReplica
from gpufleet.autoscale.controller import Controller
from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.policies import QueueDepthPolicy
from gpufleet.errors import UserError
from gpufleet.fleet.config import validate_fleet
from gpufleet.fleet_state import GatewaySignals
from gpufleet.routing.types import ReplicaState


def test_backend_defaults_to_local_and_takes_the_issue_yaml() -> None:
    assert validate_fleet({}).backend.kind == "local"
    cfg = validate_fleet(
        {
            "replicas": {"tp": 4, "pp": 2},
            "backend": {"kind": "ray", "address": "auto", "namespace": "gpufleet"},
        }
    )
    assert (cfg.backend.kind, cfg.backend.address, cfg.backend.namespace) == (
        "ray",
        "auto",
        "gpufleet",
    )
    assert cfg.replicas.values()["pp"] == 2


@pytest.mark.parametrize(
    ("backend", "field"),
    [
        ({"kind": "slurm"}, "backend.kind"),
        ({"kind": "ray", "adress": "auto"}, "backend.adress"),
        ({"kind": "ray", "fleet_name": "a/b"}, "backend.fleet_name"),
        ({"kind": "ray", "cpus_per_bundle": -1}, "backend.cpus_per_bundle"),
    ],
)
def test_bad_backend_names_the_field(backend: dict, field: str) -> None:
    with pytest.raises(UserError, match=field.replace(".", r"\.")):
        validate_fleet({"backend": backend})


@pytest.mark.process
def test_ray_flags_need_the_ray_backend() -> None:
    gpufleet = str(Path(sys.executable).with_name("gpufleet"))
    out = subprocess.run(
        [gpufleet, "up", "--port", "0", "--ray-address", "auto"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--backend" in out.stderr and "add --backend ray" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.process
def test_sim_ray_address_is_for_sweeps() -> None:
    gpufleet = str(Path(sys.executable).with_name("gpufleet"))
    out = subprocess.run(
        [gpufleet, "sim", "--rate", "1", "--duration", "1", "--ray-address", "auto"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--ray-address" in out.stderr and "--sweep" in out.stderr


def test_without_the_extra_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.autoscale.raycluster import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(UserError, match=r"pip install 'gpufleet\[ray\]'"):
        require_ray()


class PendingActuator:
    """An actuator whose one replica cannot be placed (Ray's real one: tests/raycluster)."""

    def __init__(self) -> None:
        self.replicas = [ManagedReplica("r1", "", ReplicaState.STARTING, 0.0, 10.0)]
        self.started: list[int] = []

    async def start(self, n: int) -> list[ManagedReplica]:
        self.started.append(n)
        return []

    async def drain(self, replica_id: str) -> None: ...

    async def undrain(self, replica_id: str) -> bool:
        return False

    async def stop(self, replica_id: str) -> None: ...

    def list(self) -> list[ManagedReplica]:
        return list(self.replicas)

    def observed_cold_start_s(self) -> float | None:
        return None

    def pending_reason(self) -> str:
        return "placement pending (r1 for 12 s): short of GPU"


async def test_the_pending_note_joins_the_decision_reason() -> None:
    async def no_load() -> GatewaySignals:
        return GatewaySignals()

    act = PendingActuator()
    policy = QueueDepthPolicy(ReplicaBounds(1, 1), capacity_per_replica=8)
    decision = await Controller(policy, act, no_load).tick()
    assert decision.reason.endswith("; placement pending (r1 for 12 s): short of GPU")
    assert decision.desired_replicas == 1 and act.started == []  # held, no second start
