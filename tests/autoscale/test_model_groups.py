"""The fleet YAML's `groups:`: docs/multi-model.md's example validates, each group keeps its
own settings, a single-group YAML is one group, and mistakes name the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.errors import UserError
from gpufleet.fleet.config import FleetConfig, validate_fleet

DOC = Path(__file__).resolve().parents[2] / "docs" / "multi-model.md"


def doc_fleet() -> dict[str, Any]:
    """The first ```yaml block of docs/multi-model.md (the two-model, two-engine fleet)."""
    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None
    data: dict[str, Any] = yaml.safe_load(block.group(1))
    return data


def test_the_documented_fleet_is_two_groups_on_two_engines() -> None:
    cfg = validate_fleet(doc_fleet(), source=str(DOC))
    llama, qwen = cfg.fleet_groups()
    assert (llama.label, qwen.label) == ("llama", "qwen")
    assert (llama.replicas.engine, qwen.replicas.engine) == ("vllm", "sglang")
    assert "--engine sglang --enable-metrics" in qwen.replicas.full_command()
    assert "--engine vllm" in llama.replicas.full_command()
    assert (qwen.autoscale.min_replicas, qwen.autoscale.max_replicas) == (0, 2)
    assert llama.policy_params()["ttft_p90_slo_s"] == 0.5
    assert "ttft_p90_slo_s" not in qwen.policy_params()
    settings = cfg.gateway_settings()
    assert settings["models"] == ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B"]
    # the qwen group's own queue goes to the gateway as that model's queue
    assert settings["queue"]["models"] == {
        "Qwen/Qwen3-8B": {"max_size": 32, "timeout_s": 120, "retry_after_s": 10}
    }
    from gpufleet.gateway.config import validate_config

    default, own = validate_config(settings).queue.limits()
    assert (default.max_size, own["Qwen/Qwen3-8B"].max_size) == (256, 32)
    assert own["Qwen/Qwen3-8B"].timeout_s == 120


def test_a_single_group_yaml_is_one_group() -> None:
    cfg = validate_fleet({"replicas": {"model": "Qwen/Qwen3-8B"}, "autoscale": {"max_replicas": 3}})
    (only,) = cfg.fleet_groups()
    assert only.replicas.model == "Qwen/Qwen3-8B" and only.autoscale.max_replicas == 3
    assert cfg.gateway_settings()["models"] == ["Qwen/Qwen3-8B"]
    assert "queue" not in cfg.gateway_settings()
    assert only.replicas.full_command() == cfg.replicas.full_command()
    assert "--engine" not in only.replicas.full_command()  # engine: auto adds nothing


def _groups(*models: str, **extra: Any) -> dict[str, Any]:
    return {"groups": [{"replicas": {"model": m}} for m in models], **extra}


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        (_groups("Qwen/Qwen3-8B", replicas={"model": "x"}), "", "set replicas inside each group"),
        (_groups("Qwen/Qwen3-8B", autoscale={"min_replicas": 0}), "", "autoscale inside"),
        (_groups("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"), "", "the model 'Qwen/Qwen3-8B' of groups[0]"),
        ({"groups": [{"name": "a b", "replicas": {}}]}, "groups[0].name", "pattern"),
        ({"groups": [{"replicas": {"engine": "llamacpp"}}]}, "groups[0].replicas.engine", ""),
        (
            {"groups": [{"autoscale": {"params": {"capacity_per_replica": "x"}}}]},
            "groups[0].autoscale.params.capacity_per_replica",
            "not an integer",
        ),
        ({"groups": [{"autoscale": {"params": {"nope": 1}}}]}, "", "nope"),
    ],
)
def test_mistakes_name_the_field(data: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(UserError) as err:
        validate_fleet(data)
    assert says in str(err.value)
    if field:
        assert field in (err.value.field or "") + str(err.value)


def test_names_default_to_the_models_last_part_and_must_differ() -> None:
    cfg = validate_fleet(_groups("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B"))
    assert [g.label for g in cfg.fleet_groups()] == ["Llama-3.1-8B", "Qwen3-8B"]
    with pytest.raises(UserError, match="the name 'x' of groups"):
        validate_fleet({"groups": [{"name": "x", "replicas": {"model": m}}
                                   for m in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B")]})  # fmt: skip


def test_a_round_trip_through_model_dump_keeps_the_groups() -> None:
    """`gpufleet up --backend ray` re-validates the dumped config."""
    cfg = validate_fleet(doc_fleet())
    again = validate_fleet(cfg.model_dump())
    assert again == cfg and isinstance(again, FleetConfig)
