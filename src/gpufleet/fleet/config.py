"""The fleet config of `gpufleet up`, validated; every error names the field and the fix.

```yaml
replicas:
  model: meta-llama/Llama-3.1-8B
  gpu: h100-sxm
  # Any OpenAI-compatible server works, e.g.
  # command: vllm serve {model} --port {port} --tensor-parallel-size {tp}
  args: --max-num-seqs 64
  startup_s: 20            # simulated model load time of `gpufleet replica`
autoscale:
  policy: default          # default | queue_depth | hpa | kpa | ray_serve
  min_replicas: 1
  max_replicas: 8
  params: {kv_usage_threshold: 0.9, headroom_fraction: 0.1}
gateway:                   # the gateway's own config keys (gpufleet gateway --config)
  port: 8000
  policy: prefix_aware
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.local import DEFAULT_COMMAND, check_template
from gpufleet.autoscale.policies import make_policy
from gpufleet.errors import UserError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaSpec(_Strict):
    command: str = DEFAULT_COMMAND
    args: str = ""  # appended to the command (e.g. --max-num-seqs 64)
    model: str = "meta-llama/Llama-3.1-8B"
    gpu: str = "h100-sxm"
    tp: int = Field(default=1, ge=1)
    startup_s: float = Field(default=20.0, ge=0)
    time_scale: float = Field(default=1.0, gt=0)
    # What the autoscaler assumes a cold start takes before it has seen one.
    expected_startup_s: float | None = Field(default=None, gt=0)
    drain_deadline_s: float = Field(default=60.0, gt=0)
    health_timeout_s: float = Field(default=600.0, gt=0)
    restart_crashed: bool = True

    def full_command(self) -> str:
        return f"{self.command} {self.args}".strip()

    def values(self) -> dict[str, object]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "tp": self.tp,
            "startup_s": self.startup_s,
            "time_scale": self.time_scale,
        }


class AutoscaleSpec(_Strict):
    enabled: bool = True
    policy: str = "default"
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=8, ge=1)
    initial_replicas: int | None = Field(default=None, ge=0)
    interval_s: float = Field(default=1.0, gt=0)
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be ≥ min_replicas")
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            raise ValueError("initial_replicas must lie within [min_replicas, max_replicas]")
        return self

    def bounds(self) -> ReplicaBounds:
        return ReplicaBounds(self.min_replicas, self.max_replicas)

    def first_count(self) -> int:
        if self.initial_replicas is not None:
            return self.initial_replicas
        return max(1, self.min_replicas)


class FleetConfig(_Strict):
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec)
    autoscale: AutoscaleSpec = Field(default_factory=AutoscaleSpec)
    # Passed to the gateway's own config (validated there); host/port/policy defaults below.
    gateway: dict[str, Any] = Field(default_factory=dict)
    log_dir: str | None = None  # replica logs; default: a temporary directory

    def gateway_settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": "127.0.0.1", "port": 8000, "policy": "prefix_aware"}
        out.update(self.gateway)
        out.setdefault("models", [self.replicas.model])
        return out


def validate_fleet(data: Any, source: str = "fleet config") -> FleetConfig:
    if not isinstance(data, dict):
        raise UserError(
            "the top level must be a mapping", field=source, fix="see `gpufleet up --help`"
        )
    try:
        cfg = FleetConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or source
        fix = (
            "remove it or check its spelling"
            if err["type"] == "extra_forbidden"
            else "see the example in `gpufleet up --help`"
        )
        raise UserError(err["msg"], field=field, fix=fix) from None
    check_template(cfg.replicas.full_command())
    # Build the policy once now so a bad parameter fails before any process starts.
    make_policy(cfg.autoscale.policy, cfg.autoscale.bounds(), cfg.autoscale.params)
    return cfg


def load_fleet(path: str | Path | None) -> FleetConfig:
    if path is None:
        return validate_fleet({})
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise UserError(str(exc), field="FLEET_YAML", fix="pass an existing YAML file") from None
    except yaml.YAMLError as exc:
        raise UserError(f"not valid YAML: {exc}", field=str(p), fix="fix the YAML syntax") from None
    return validate_fleet(data or {}, source=str(p))
