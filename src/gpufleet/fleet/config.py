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
  # capacity_per_replica (queue_depth, default): unset, it is derived from the plan for
  # `gpufleet replica` (plan/capacity.py), from tokens_per_request (default 1280 = the
  # plan's 1024 in + 256 out) and --max-num-seqs / --max-model-len in replicas.args.
  tokens_per_request: 1280
gateway:                   # the gateway's own config keys (gpufleet gateway --config)
  port: 8000
  policy: prefix_aware
backend:                   # local (default) or ray (docs/ray.md)
  kind: ray
  address: auto            # auto | ray://HOST:10001; unset: a local Ray cluster of its own
  namespace: gpufleet
```

Several models in one fleet (docs/multi-model.md): `groups:` instead of `replicas:` and
`autoscale:`; each group has its own replicas, autoscaler and scale-from-zero queue.

```yaml
groups:
  - name: llama
    replicas: {model: meta-llama/Llama-3.1-8B, engine: vllm}
    autoscale: {min_replicas: 1, max_replicas: 4, params: {ttft_p90_slo_s: 0.5}}
  - name: qwen
    replicas: {model: Qwen/Qwen3-8B, engine: sglang, tp: 2}
    autoscale: {min_replicas: 0, max_replicas: 2}
    queue: {max_size: 32, timeout_s: 120}
```
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.local import DEFAULT_COMMAND, check_template
from gpufleet.autoscale.policies import make_policy
from gpufleet.config_errors import Positions, load_yaml, user_error
from gpufleet.errors import UserError
from gpufleet.gateway.config import EngineName
from gpufleet.plan.capacity import DEFAULT_TOKENS_PER_REQUEST, ReplicaCapacity, replica_capacity

# Policies whose capacity_per_replica the fleet derives when the user did not set it.
CAPACITY_POLICIES = ("default", "queue_depth")
_POLICY_DEFAULT_CAPACITY = 256  # the policies' own default (vLLM's max_num_seqs)
PERSONALITIES = ("vllm", "sglang")  # the engines `gpufleet replica --engine` imitates


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaSpec(_Strict):
    command: str = DEFAULT_COMMAND
    args: str = ""  # appended to the command (e.g. --max-num-seqs 64)
    model: str = "meta-llama/Llama-3.1-8B"
    gpu: str = "h100-sxm"
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)  # pipeline stages (Ray: one bundle per stage)
    startup_s: float = Field(default=20.0, ge=0)
    time_scale: float = Field(default=1.0, gt=0)
    # What the autoscaler assumes a cold start takes before it has seen one.
    expected_startup_s: float | None = Field(default=None, gt=0)
    drain_deadline_s: float = Field(default=60.0, gt=0)
    health_timeout_s: float = Field(default=600.0, gt=0)
    restart_crashed: bool = True
    # What the replicas run, for the gateway's metric names (auto: named from /metrics);
    # `gpufleet replica` also gets `--engine` from it (sglang: with --enable-metrics).
    engine: EngineName = "auto"

    def full_command(self) -> str:
        command = f"{self.command} {self.args}".strip()
        if self.engine in PERSONALITIES and self.is_simulated() and "--engine" not in command:
            command += f" --engine {self.engine}"
            command += " --enable-metrics" if self.engine == "sglang" else ""
        return command

    def is_simulated(self) -> bool:
        """Replicas are `gpufleet replica` (whose layout the plan can size)."""
        head = self.command.split()[:2]
        return len(head) == 2 and head[0] in ("{gpufleet}", "gpufleet") and head[1] == "replica"

    def arg_int(self, flag: str) -> int | None:
        """The integer value of `flag` (e.g. --max-num-seqs) in `args`, if given."""
        try:
            words = shlex.split(self.args)
        except ValueError as e:
            raise UserError(str(e), field="replicas.args", fix="fix the quoting") from None
        value: str | None = None
        for i, w in enumerate(words):
            if w == flag and i + 1 < len(words):
                value = words[i + 1]
            elif w.startswith(flag + "="):
                value = w.split("=", 1)[1]
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise UserError(
                f"{flag} {value!r} is not an integer", field="replicas.args", fix=f"{flag} 64"
            ) from None

    def values(self) -> dict[str, object]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "tp": self.tp,
            "pp": self.pp,
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
    # Expected input + output tokens of one request, to derive capacity_per_replica.
    tokens_per_request: int | None = Field(default=None, ge=1)

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


class BackendSpec(_Strict):
    """Where replicas run: `local` child processes, or `ray` placement groups and actors."""

    kind: Literal["local", "ray"] = "local"
    # ray: auto | ray://HOST:10001 | HOST:PORT; unset: a local Ray cluster of its own.
    address: str | None = None
    namespace: str = Field(default="gpufleet", min_length=1)
    fleet_name: str = Field(default="gpufleet", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # Per placement-group bundle (one per pipeline stage), beside the stage's TP GPUs.
    cpus_per_bundle: float = Field(default=1.0, ge=0)
    memory_gb_per_bundle: float | None = Field(default=None, gt=0)
    resources_per_bundle: dict[str, float] = Field(default_factory=dict)
    # GPUs the local cluster of its own declares (none need exist); default: enough for
    # max_replicas.
    local_gpus: int | None = Field(default=None, ge=0)
    # Seconds between a ready replica's /health probes; this many failures replace it.
    probe_interval_s: float = Field(default=1.0, gt=0)
    probe_failures: int = Field(default=3, ge=1)


class GroupQueueSpec(_Strict):
    """A group's own scale-from-zero queue at the gateway (unset keys: the gateway's queue)."""

    max_size: int | None = Field(default=None, ge=0)
    timeout_s: float | None = Field(default=None, gt=0)
    retry_after_s: int | None = Field(default=None, ge=1)


class TrafficSpec(_Strict):
    """What `gpufleet plan --groups` sizes a group for (`up` does not read it)."""

    rps: float = Field(default=1.0, gt=0)
    input_tokens: int = Field(default=1024, ge=1)
    output_tokens: int = Field(default=256, ge=1)
    # unset: the group's autoscale.params.ttft_p90_slo_s, else the plan's 1 s
    ttft_slo_s: float | None = Field(default=None, gt=0)
    tpot_slo_s: float = Field(default=0.05, gt=0)


class GroupSpec(_Strict):
    """One model group: its replicas, its autoscaler (policy, bounds, SLOs) and queue."""

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec)
    autoscale: AutoscaleSpec = Field(default_factory=AutoscaleSpec)
    queue: GroupQueueSpec | None = None
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    _where: str = PrivateAttr(default="")  # "groups[1]." in a groups: list, for errors

    @property
    def label(self) -> str:
        """The group's name; unset: its model's last path part."""
        return self.name or self.replicas.model.rsplit("/", 1)[-1]

    def capacity(self) -> ReplicaCapacity | None:
        """capacity_per_replica for the policy, and where it came from; None when the
        policy takes none. The user's value wins; else the plan's concurrent sequences for
        `gpufleet replica`; else (another command) the policy's default."""
        a, rs, where = self.autoscale, self.replicas, self._where
        if a.policy not in CAPACITY_POLICIES:
            return None
        if "capacity_per_replica" in a.params:
            value = a.params["capacity_per_replica"]
            if not isinstance(value, int) or isinstance(value, bool):
                raise UserError(
                    f"{value!r} is not an integer",
                    field=f"{where}autoscale.params.capacity_per_replica",
                    fix="e.g. 64",
                )
            return ReplicaCapacity(value, f"set in {where}autoscale.params.capacity_per_replica")
        if not rs.is_simulated():
            return ReplicaCapacity(
                _POLICY_DEFAULT_CAPACITY,
                f"default {_POLICY_DEFAULT_CAPACITY}: the plan cannot size replicas of a "
                f"custom command; set {where}autoscale.params.capacity_per_replica",
            )
        tokens = a.tokens_per_request or DEFAULT_TOKENS_PER_REQUEST
        return replica_capacity(
            rs.model,
            rs.gpu,
            tp=rs.tp,
            max_num_seqs=rs.arg_int("--max-num-seqs") or _POLICY_DEFAULT_CAPACITY,
            max_model_len=rs.arg_int("--max-model-len"),
            tokens_per_request=tokens,
            tokens_source=(
                f"{where}autoscale.tokens_per_request"
                if a.tokens_per_request
                else "default request 1024 in + 256 out"
            ),
        )

    def policy_params(self) -> dict[str, Any]:
        """The policy's parameters, with the derived capacity_per_replica filled in."""
        params = dict(self.autoscale.params)
        cap = self.capacity()
        if cap is not None:
            params["capacity_per_replica"] = cap.sequences
            params.setdefault("capacity_source", cap.source)
        return params


class FleetConfig(_Strict):
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec)
    autoscale: AutoscaleSpec = Field(default_factory=AutoscaleSpec)
    # Several model groups in one fleet; set, `replicas` and `autoscale` stay unset.
    groups: list[GroupSpec] = Field(default_factory=list)
    # Passed to the gateway's own config (validated there); host/port/policy defaults below.
    gateway: dict[str, Any] = Field(default_factory=dict)
    log_dir: str | None = None  # replica logs; default: a temporary directory
    # `gpufleet deploy k8s` reads it (gpufleet.k8s.settings validates it there); `up` ignores it.
    kubernetes: dict[str, Any] = Field(default_factory=dict)
    backend: BackendSpec = Field(default_factory=BackendSpec)

    @model_validator(mode="after")
    def _one_way_to_say_it(self) -> FleetConfig:
        if not self.groups:
            return self
        for key, default in (("replicas", ReplicaSpec()), ("autoscale", AutoscaleSpec())):
            if getattr(self, key) != default:
                raise ValueError(f"with groups, set {key} inside each group, not at the top")
        seen: dict[str, str] = {}
        for i, g in enumerate(self.groups):
            g._where = f"groups[{i}]."
            for kind, value in (("model", g.replicas.model), ("name", g.label)):
                if f"{kind}:{value}" in seen:
                    raise ValueError(f"groups[{i}] has the {kind} {value!r} of "
                                     f"{seen[f'{kind}:{value}']}; each group its own")  # fmt: skip
                seen[f"{kind}:{value}"] = f"groups[{i}]"
        return self

    def fleet_groups(self) -> list[GroupSpec]:
        """The groups; a single-group config (`replicas` + `autoscale`) is one group."""
        if self.groups:
            return list(self.groups)
        return [GroupSpec(replicas=self.replicas, autoscale=self.autoscale)]

    def gateway_settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": "127.0.0.1", "port": 8000, "policy": "prefix_aware"}
        out.update(self.gateway)
        groups = self.fleet_groups()
        out.setdefault("models", [g.replicas.model for g in groups])
        own = {
            g.replicas.model: g.queue.model_dump(exclude_none=True)
            for g in groups
            if g.queue is not None
        }
        if own:  # a group's queue; the gateway's own queue.models entries win
            queue = dict(out.get("queue") or {})
            queue["models"] = {**own, **dict(queue.get("models") or {})}
            out["queue"] = queue
        batches = [g.replicas.arg_int("--max-num-seqs") for g in groups]
        known = [b for b in batches if b]
        if out["policy"] == "prefix_aware" and known and len(known) == len(batches):
            # prefix_aware's in-flight slack is a share of the batch (the smallest group's).
            out["policy_options"] = {"batch_size": min(known), **(out.get("policy_options") or {})}
        return out

    def capacity(self) -> ReplicaCapacity | None:
        """The first group's capacity_per_replica (the only group of a single-group config)."""
        return self.fleet_groups()[0].capacity()

    def policy_params(self) -> dict[str, Any]:
        return self.fleet_groups()[0].policy_params()


def validate_fleet(
    data: Any, source: str = "fleet config", positions: Positions | None = None
) -> FleetConfig:
    cfg = parse_fleet(data, source, positions)
    for group in cfg.fleet_groups():
        check_template(group.replicas.full_command())
        # Build the policy once now so a bad parameter fails before any process starts.
        a = group.autoscale
        make_policy(a.policy, a.bounds(), group.policy_params())
    return cfg


def parse_fleet(
    data: Any, source: str = "fleet config", positions: Positions | None = None
) -> FleetConfig:
    """The fleet config's fields, checked; nothing derived yet (`gpufleet deploy k8s`
    sizes replicas from the plan, not from the local replica command)."""
    if not isinstance(data, dict):
        raise UserError(
            "the top level must be a mapping", field=source, fix="see `gpufleet up --help`"
        )
    try:
        cfg = FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise user_error(
            exc,
            FleetConfig,
            source if positions else "",
            positions,
            fix="see the example in `gpufleet up --help`",
        ) from None
    gateway = data.get("gateway")
    if isinstance(gateway, dict):  # checked now, with its place in this file
        from gpufleet.gateway.config import validate_config

        validate_config(gateway, source, positions, prefix=("gateway",))
    return cfg


def load_fleet(path: str | Path | None, *, derive: bool = True) -> FleetConfig:
    """derive=False: `parse_fleet` only (for `gpufleet deploy k8s`)."""
    check = validate_fleet if derive else parse_fleet
    if path is None:
        return check({})
    data, positions = load_yaml(path, "FLEET_YAML")
    return check(data or {}, source=str(path), positions=positions)
