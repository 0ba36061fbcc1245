"""Builders for fleet-core tests (plain objects, no network)."""

from __future__ import annotations

from gpufleet.fleet_state import AdmissionQueue, FleetReplica, FleetState
from gpufleet.routing import make_policy
from gpufleet.routing.types import ReplicaState, RequestInfo


def replica(rid: str, models: tuple[str, ...] = ("m",), pool: str | None = None,
            state: ReplicaState = ReplicaState.STARTING) -> FleetReplica:  # fmt: skip
    return FleetReplica(replica_id=rid, url=f"http://{rid}", models=frozenset(models),
                        state=state, pool=pool)  # fmt: skip


def fleet(policy: str = "least_outstanding", served: tuple[str, ...] = ("m",), max_size: int = 2,
          timeout_s: float = 4.0, **kw: object) -> FleetState[FleetReplica]:  # fmt: skip
    return FleetState[FleetReplica](
        make_policy(policy, seed=0),
        served_models=served,
        queue=AdmissionQueue(max_size, timeout_s, retry_after_s=7),
        **kw,  # type: ignore[arg-type]
    )


def ready(f: FleetState[FleetReplica], rid: str, **kw: object) -> FleetReplica:
    """Add a replica and let its first probe pass, as the gateway does."""
    r = f.table.add(replica(rid, **kw))  # type: ignore[arg-type]
    assert f.table.probe_passed(r)
    assert f.table.mark_ready(r)
    return r


def info(i: int, model: str = "m", **kw: object) -> RequestInfo:
    return RequestInfo(request_id=f"q{i}", model=model, **kw)  # type: ignore[arg-type]
