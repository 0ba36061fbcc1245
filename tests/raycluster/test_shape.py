"""Placement-group shapes, names and shortage messages (pure: no Ray needed)."""

from __future__ import annotations

from gpufleet.autoscale.raycluster.shape import (
    ReplicaShape,
    parse_replica_name,
    replica_index,
    replica_name,
    shortage,
)


def test_one_bundle_per_stage_with_tp_gpus() -> None:
    s = ReplicaShape(tp=2, pp=3, cpus_per_bundle=4, memory_bytes_per_bundle=8 << 30,
                     resources_per_bundle={"accelerator_type:H100": 0.001})  # fmt: skip
    assert (
        s.bundles()
        == [{"GPU": 2.0, "CPU": 4.0, "memory": float(8 << 30), "accelerator_type:H100": 0.001}] * 3
    )
    assert s.strategy == "PACK" and s.gpus == 6
    assert ReplicaShape(tp=8).strategy == "STRICT_PACK"  # PP=1 never crosses a node
    assert ReplicaShape(tp=1, cpus_per_bundle=0).bundle() == {"GPU": 1.0}


def test_names_round_trip_and_foreign_names_are_ignored() -> None:
    name = replica_name("prod.eu", "replica-12", 3)
    assert name == "prod.eu/replica-12.3"
    assert parse_replica_name("prod.eu", name) == ("replica-12", 3)
    assert parse_replica_name("prod", name) is None
    assert parse_replica_name("prod.eu", "prod.eu/controller") is None
    assert replica_index("replica-12") == 12 and replica_index("odd") == 0


def test_shortage_names_the_short_resource() -> None:
    free = {"n1": {"GPU": 4.0, "CPU": 8.0}, "n2": {"GPU": 2.0, "CPU": 1.0}}
    msg = shortage(ReplicaShape(tp=8, cpus_per_bundle=2), free)
    assert msg.startswith("short of GPU: needs 8 on one node, at most 4 free on any node")
    assert "6 free in the cluster" in msg and "CPU" not in msg
    msg = shortage(ReplicaShape(tp=4, pp=3, cpus_per_bundle=1), free)
    assert "GPU: needs 4 in each of 3 stages, room for 1 stage(s)" in msg
    assert "fragmented" in shortage(ReplicaShape(tp=2), free)
