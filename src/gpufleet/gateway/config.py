"""The gateway's one YAML config, validated by pydantic; every error names the field and the fix.

```yaml
port: 8000
policy: least_outstanding
admin_key: change-me
replicas:
  - url: http://127.0.0.1:8001
  - {url: http://127.0.0.1:8002, pool: gold, engine: sglang}
tenants:
  - {name: acme, api_keys: [sk-acme], pool: gold, requests_per_s: 50, max_concurrency: 16}
adapters:                # LoRA adapters (docs/lora.md)
  - {name: sql-lora, path: /adapters/sql, base_model: meta-llama/Llama-3.1-8B}
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpufleet.config_errors import Positions, load_yaml, user_error
from gpufleet.errors import UserError
from gpufleet.fleet_state import AdapterSpec, OutlierConfig, QueueLimits


class _Strict(BaseModel):
    # Unknown keys are typos more often than not: refuse them so the error names them.
    model_config = ConfigDict(extra="forbid")


# What a replica runs: auto = named from its /metrics (and its other answers); openai = a
# plain OpenAI-compatible server without load metrics (routed by in-flight counts).
EngineName = Literal["auto", "vllm", "sglang", "tgi", "trtllm", "openai"]


class ReplicaConfig(_Strict):
    url: str
    id: str | None = None
    pool: str | None = None
    # Models it serves; empty = learn them from the replica's /v1/models.
    models: list[str] = Field(default_factory=list)
    engine: EngineName | None = None  # None: the gateway's `engine`

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        # Replicas sit on the private network; the proxy speaks plain HTTP/1.1 to them.
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("must be an http:// URL such as http://127.0.0.1:8001")
        return v.rstrip("/")


class TenantConfig(_Strict):
    name: str
    api_keys: list[str] = Field(min_length=1)
    pool: str | None = None  # pin: this tenant's traffic reaches only replicas of this pool
    policy: str | None = None  # overrides the gateway's policy for this tenant
    policy_options: dict[str, Any] | None = None  # default: the gateway's, same policy only
    requests_per_s: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)  # token-bucket size; default max(1, rate)
    max_concurrency: int | None = Field(default=None, ge=1)
    failover: bool | None = None  # unset: the model's (or the gateway's) setting


class AdapterConfig(_Strict):
    """A LoRA adapter the fleet serves: clients send `name` as their `model`; the gateway
    loads it onto replicas of `base_model` from `path` (vLLM `/v1/load_lora_adapter`)."""

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)  # a directory on the replicas' hosts, or a hub id
    base_model: str | None = None  # default: the one entry of `models`


class HealthConfig(_Strict):
    """Active health checking: /health probes."""

    probe_interval_s: float = Field(default=2.0, gt=0)
    probe_timeout_s: float = Field(default=2.0, gt=0)
    # Out of routing after this many failed probes in a row (refused or an error status;
    # a probe that times out while the replica is streaming to the gateway does not count,
    # one that times out otherwise counts as a failed request under `outlier`).
    eject_after_failures: int = Field(default=3, ge=1)
    # Back after this many passing probes in a row.
    readmit_after_successes: int = Field(default=1, ge=1)


class OutlierSettings(_Strict):
    """Outlier detection on proxied requests, as Envoy's (fleet_state.outlier)."""

    consecutive_failures: int = Field(default=5, ge=1)
    base_ejection_time_s: float = Field(default=30.0, gt=0)
    max_ejection_time_s: float = Field(default=300.0, gt=0)
    max_ejection_percent: float = Field(default=50.0, ge=0, le=100)
    interval_s: float = Field(default=10.0, gt=0)
    success_rate_minimum_hosts: int = Field(default=5, ge=1)
    success_rate_request_volume: int = Field(default=100, ge=1)
    success_rate_stdev_factor: float = Field(default=1.9, ge=0)

    def core(self) -> OutlierConfig:
        return OutlierConfig(**self.model_dump())


class LimitsConfig(_Strict):
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    client_body_timeout_s: float = Field(default=30.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    # Longest silence from upstream (before the first byte and between chunks).
    read_timeout_s: float = Field(default=600.0, gt=0)
    total_timeout_s: float | None = Field(default=None, gt=0)
    # Attempts per request when failing before the first byte (1 = no retry).
    max_attempts: int = Field(default=3, ge=1, le=10)


class FailoverModel(_Strict):
    """Failover settings of one model (unset: the gateway's)."""

    enabled: bool | None = None
    dialect: Literal["vllm", "sglang", "none"] | None = None


class FailoverConfig(_Strict):
    """Mid-stream failover: a stream whose replica fails after its first byte is resumed on
    another replica (gateway.failover)."""

    enabled: bool = True
    # Resumes per request before giving up with an error event.
    max_resumes: int = Field(default=3, ge=0, le=20)
    # A streaming replica silent for longer than this has stalled (resumed elsewhere).
    inter_token_timeout_s: float = Field(default=30.0, gt=0)
    # How the engines continue a partial chat answer: vllm (continue_final_message +
    # add_generation_prompt: false), sglang (continue_final_message), none (they cannot:
    # a broken stream ends with an error event, as without failover).
    dialect: Literal["vllm", "sglang", "none"] = "vllm"
    models: dict[str, FailoverModel] = Field(default_factory=dict)


class ModelQueueConfig(_Strict):
    """A model's own queue (a model group's scale from zero); unset: the shared queue's."""

    max_size: int | None = Field(default=None, ge=0)
    timeout_s: float | None = Field(default=None, gt=0)
    retry_after_s: int | None = Field(default=None, ge=1)


class QueueConfig(_Strict):
    """Requests that find no ready replica for their model wait here (scale from zero)."""

    max_size: int = Field(default=256, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)
    retry_after_s: int = Field(default=5, ge=1)
    # model -> its own queue; the other models share this one.
    models: dict[str, ModelQueueConfig] = Field(default_factory=dict)

    def limits(self) -> tuple[QueueLimits, dict[str, QueueLimits]]:
        default = QueueLimits(self.max_size, self.timeout_s, self.retry_after_s)
        own = {
            model: QueueLimits(
                q.max_size if q.max_size is not None else self.max_size,
                q.timeout_s if q.timeout_s is not None else self.timeout_s,
                q.retry_after_s if q.retry_after_s is not None else self.retry_after_s,
            )
            for model, q in self.models.items()
        }
        return default, own


class GatewayConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    policy: str = "round_robin"
    policy_options: dict[str, Any] = Field(default_factory=dict)
    # The engine of replicas that do not name theirs (see ReplicaConfig.engine).
    engine: EngineName = "auto"
    seed: int | None = None
    admin_key: str | None = None
    replicas: list[ReplicaConfig] = Field(default_factory=list)
    # Models the fleet serves even while no replica is up (scale from zero).
    models: list[str] = Field(default_factory=list)
    tenants: list[TenantConfig] = Field(default_factory=list)
    # LoRA adapters, loaded onto replicas of their base model as traffic asks (docs/lora.md).
    adapters: list[AdapterConfig] = Field(default_factory=list)
    scrape_interval_s: float = Field(default=1.0, gt=0)
    signals_window_s: float = Field(default=60.0, gt=0)
    # Slow start: a replica that becomes ready ramps its routing weight over this many
    # seconds (routing.slow_start; least_outstanding, power_of_two); 0 = off.
    slow_start_s: float = Field(default=0.0, ge=0)
    # Re-read the config file's replica list when it changes (0 = only on SIGHUP or admin).
    reload_interval_s: float = Field(default=2.0, ge=0)
    health: HealthConfig = Field(default_factory=HealthConfig)
    outlier: OutlierSettings = Field(default_factory=OutlierSettings)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig)
    failover: FailoverConfig = Field(default_factory=FailoverConfig)
    # Gateway processes sharing the port (SO_REUSEPORT), one core each (gateway.workers).
    workers: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        seen: dict[str, str] = {}
        for i, t in enumerate(self.tenants):
            for key in t.api_keys:
                if key in seen:
                    raise ValueError(
                        f"tenants[{i}].api_keys: key already belongs to tenant {seen[key]!r}"
                    )
                seen[key] = t.name
        ids = [r.id for r in self.replicas if r.id]
        if len(ids) != len(set(ids)):
            raise ValueError("replicas: two replicas share one id")
        names: set[str] = set()
        for i, a in enumerate(self.adapters):
            if a.name in names or a.name in self.models:
                raise ValueError(f"adapters[{i}].name: {a.name!r} is already a model or adapter")
            names.add(a.name)
            if a.base_model is None:
                if len(self.models) != 1:
                    raise ValueError(
                        f"adapters[{i}].base_model: set it (the model whose replicas serve "
                        f"{a.name!r}), or list exactly one model in `models`"
                    )
                a.base_model = self.models[0]
        return self

    def adapter_specs(self) -> list[AdapterSpec]:
        return [AdapterSpec(a.name, a.path, a.base_model or "") for a in self.adapters]


def validate_config(
    data: Any,
    source: str = "config",
    positions: Positions | None = None,
    prefix: tuple[str | int, ...] = (),
) -> GatewayConfig:
    """A GatewayConfig from plain data, or a UserError naming the first bad field (with its
    file, line and column when `positions` come from the YAML file)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError("the top level must be a mapping", field=source, fix="write key: value")
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise user_error(
            exc, GatewayConfig, source, positions, prefix=prefix, fix="see docs/gateway.md"
        ) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Read a YAML file (plus CLI overrides at the top level) into a validated config."""
    data, positions = load_yaml(path, "--config")
    if data is None:
        data = {}
    if isinstance(data, dict) and overrides:
        data = {**data, **overrides}
    return validate_config(data, source=str(path), positions=positions)
