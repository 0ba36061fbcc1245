"""prefix_aware's in-flight slack follows the replicas' batch (`batch_size`): 8 sequences over
the mean was measured on vLLM's 256-sequence batches; on replicas that batch 8 it queued a
whole batch on the holder of a prefix while others idled (the demo, wave 18)."""

from __future__ import annotations

from gpufleet.fleet.config import validate_fleet
from gpufleet.fleet.demo import demo_fleet, demo_fleet_data
from gpufleet.routing import make_policy
from gpufleet.routing.prefix_aware import INFLIGHT_SLACK, PrefixAware, inflight_slack_for
from gpufleet.routing.types import ReplicaView, RequestInfo


def test_the_slack_is_a_share_of_the_batch_at_least_one_sequence() -> None:
    assert inflight_slack_for(None) == INFLIGHT_SLACK == 8.0  # vLLM's 256 assumed
    assert inflight_slack_for(256) == 8.0
    assert inflight_slack_for(64) == 2.0
    assert inflight_slack_for(8) == 1.0
    assert PrefixAware(batch_size=8).inflight_slack == 1.0
    assert PrefixAware(batch_size=8, inflight_slack=3.0).inflight_slack == 3.0  # set: it wins


def route_to_a_busy_holder(**options: float) -> str:
    """One request learns a prefix onto some replica; that replica then holds 3 in flight
    and the others none: where does the next request with that prefix go?"""
    policy = PrefixAware(seed=0, inflight_factor=1.0, **options)  # type: ignore[arg-type]
    hashes = tuple(range(1, 9))
    idle = [ReplicaView(f"r{i}", f"http://r{i}") for i in range(3)]
    first = policy.choose(RequestInfo("a", "m", 512, prefix_hashes=hashes), idle)
    assert first is not None
    busy = [
        ReplicaView(r.replica_id, r.url, in_flight=3 if r.replica_id == first.replica_id else 0)
        for r in idle
    ]
    got = policy.choose(RequestInfo("b", "m", 512, prefix_hashes=hashes), busy)
    assert got is not None
    return "holder" if got.replica_id == first.replica_id else "other"


def test_a_batch_of_8_spills_a_match_before_queueing_a_batch_on_its_holder() -> None:
    assert route_to_a_busy_holder() == "holder"  # 4 ≤ mean 1.3 + 8: queues on the holder
    assert route_to_a_busy_holder(batch_size=256) == "holder"
    assert route_to_a_busy_holder(batch_size=8) == "other"  # 4 > 1.3 + 1


def test_the_fleet_tells_the_router_its_replicas_batch() -> None:
    """`gpufleet up` passes --max-num-seqs as prefix_aware's `batch_size` (the demo's 8:
    slack 1, what it used to set by hand); a user's own option wins."""
    options = demo_fleet().gateway_settings()["policy_options"]
    assert options == {"inflight_factor": 1.0, "batch_size": 8}
    assert make_policy("prefix_aware", **options).inflight_slack == 1.0
    data = demo_fleet_data()
    data["gateway"] = {"policy_options": {"batch_size": 32}}
    assert validate_fleet(data).gateway_settings()["policy_options"] == {"batch_size": 32}
    data["replicas"] = {**data["replicas"], "args": ""}  # type: ignore[dict-item]
    assert "policy_options" not in validate_fleet({**data, "gateway": {}}).gateway_settings()
    other = {**demo_fleet_data(), "gateway": {"policy": "least_outstanding"}}
    assert "policy_options" not in validate_fleet(other).gateway_settings()
