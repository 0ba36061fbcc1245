"""capacity_per_replica in a fleet: the plan's concurrent sequences unless the user set it."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.autoscale.policies import make_policy
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.errors import UserError
from gpufleet.fleet.config import FleetConfig, validate_fleet
from gpufleet.fleet.demo import demo_fleet
from gpufleet.plan.capacity import replica_capacity
from gpufleet.sim.scenario import Scenario, build_config

LLAMA = "meta-llama/Llama-3.1-8B"


def fleet(policy: str = "queue_depth", **sections: dict[str, Any]) -> FleetConfig:
    data: dict[str, Any] = {"autoscale": {"policy": policy}}
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return validate_fleet(data)


def built_capacity(cfg: FleetConfig) -> tuple[int, str]:
    policy: Any = make_policy(cfg.autoscale.policy, cfg.autoscale.bounds(), cfg.policy_params())
    return policy.capacity_per_replica, policy.capacity_source


@pytest.mark.parametrize("policy", ["queue_depth", "default"])
def test_unset_capacity_is_derived_from_the_plan(policy: str) -> None:
    cfg = fleet(policy)
    cap = cfg.capacity()
    assert cap is not None and cap.source.startswith("plan:")
    assert cap == replica_capacity(LLAMA, "h100-sxm")
    assert built_capacity(cfg) == (cap.sequences, cap.source)


def test_max_num_seqs_in_args_bounds_the_derived_capacity() -> None:
    cfg = fleet(replicas={"args": "--max-num-seqs 48 --max-model-len 4096"})
    assert built_capacity(cfg)[0] == 48
    cfg = fleet(replicas={"args": "--max-num-seqs=12"})
    assert built_capacity(cfg)[0] == 12


def test_tokens_per_request_lowers_capacity_when_the_kv_cache_binds() -> None:
    cfg = fleet(
        replicas={"args": "--max-num-seqs 1024"},
        autoscale={"tokens_per_request": 32_000},
    )
    cap = cfg.capacity()
    assert cap is not None and cap.kv_capacity_tokens is not None
    assert cap.sequences == cap.kv_capacity_tokens // 32_000 < 1024
    assert "32000 per request" in cap.source
    assert "autoscale.tokens_per_request" in cap.describe()


def test_the_users_value_wins() -> None:
    cfg = fleet(
        replicas={"args": "--max-num-seqs 48"}, autoscale={"params": {"capacity_per_replica": 5}}
    )
    value, source = built_capacity(cfg)
    assert value == 5 and "set in autoscale.params" in source
    assert built_capacity(demo_fleet("default"))[0] == 8  # the demo's --max-num-seqs 8


def test_another_command_keeps_the_default_and_says_so() -> None:
    cfg = fleet(
        replicas={"command": "vllm serve {model} --port {port}", "args": "--max-num-seqs 8"}
    )
    value, source = built_capacity(cfg)
    assert value == 256 and "custom command" in source


def test_policies_without_capacity_get_none() -> None:
    cfg = fleet("hpa")
    assert cfg.capacity() is None and "capacity_per_replica" not in cfg.policy_params()


def test_bad_args_name_the_field() -> None:
    with pytest.raises(UserError) as e:
        fleet(replicas={"args": "--max-num-seqs lots"})
    assert e.value.field == "replicas.args"


def test_reason_shows_the_capacity_and_its_source() -> None:
    cfg = fleet(replicas={"args": "--max-num-seqs 16"})
    policy = make_policy(cfg.autoscale.policy, cfg.autoscale.bounds(), cfg.policy_params())
    d = policy.decide(0.0, FleetSignals(queue_depth=40))
    assert "capacity 16 per replica [plan: min(max_num_seqs 16" in d.reason
    assert d.desired_replicas == 3


def test_sim_derives_capacity_from_the_replica_and_workload() -> None:
    sc = Scenario(autoscale="queue_depth", max_num_seqs=8, num_requests=10, rate=1.0)
    policy: Any = build_config(sc).autoscale.policy  # type: ignore[union-attr]
    assert policy.capacity_per_replica == 8
    assert "workload 1024 in + 128 out" in policy.capacity_source
    mine = Scenario(autoscale="default", autoscale_params=(("capacity_per_replica", 3),))
    assert build_config(mine).autoscale.policy.capacity_per_replica == 3  # type: ignore[union-attr]
