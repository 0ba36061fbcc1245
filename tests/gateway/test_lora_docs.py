"""docs/lora.md's gateway example is a valid config that declares what the text says."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpufleet.gateway.config import validate_config
from gpufleet.routing import make_policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "lora.md"


def test_the_documented_gateway_config_loads() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1
    cfg = validate_config(yaml.safe_load(blocks[0]))
    specs = {s.name: s for s in cfg.adapter_specs()}
    assert set(specs) == {"sql-lora", "chat-lora", "summarize-lora"}
    assert {s.base_model for s in specs.values()} == {"meta-llama/Llama-3.1-8B"}
    assert cfg.policy == "lora_affinity"
    make_policy(cfg.policy, **cfg.policy_options)  # the documented options exist
