"""`gpufleet sim --config FILE`: a fleet beyond one layout — replica groups of different
GPU types and layouts behind one gateway, tenants with their pools and limits, and the
failures it meets. Validated; every error names the field and the fix.

```yaml
groups:                       # default: one group from the layout flags (--gpu --tp ...)
  - {name: h100, gpu: h100-sxm, tp: 1, replicas: 4, autoscale: true}
  - {name: a100, gpu: a100-80gb, tp: 2, replicas: 2, pool: gold, startup_s: 90}
tenants:                      # as the gateway's tenants, with a share of the requests
  - {name: acme, share: 0.3, pool: gold, max_concurrency: 16}
  - {name: free, share: 0.7, requests_per_s: 5, burst: 10, policy: round_robin}
failures: {mtbf_s: 3600, restart: true}
max_attempts: 3               # the gateway's limits.max_attempts
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.config_errors import load_yaml
from gpufleet.errors import UserError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GroupSpec(_Strict):
    """Replicas of one layout; unset layout keys take the command's flags."""

    name: str
    gpu: str | None = None
    tp: int | None = Field(default=None, ge=1)
    pp: int | None = Field(default=None, ge=1)
    ep: int | None = Field(default=None, ge=1)
    quant: str | None = None
    kv_cache_dtype: str | None = None
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=2)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    replicas: int = Field(default=1, ge=0)
    pool: str | None = None  # the tenant pool it serves (none: the shared pool)
    autoscale: bool = False  # the autoscaler starts and drains this group's replicas
    startup_s: float | None = Field(default=None, ge=0)  # default: --startup-s
    gpu_price: float | None = Field(default=None, ge=0)  # $/GPU-hour; default: catalog


class TenantSpecConfig(_Strict):
    name: str
    share: float = Field(gt=0)  # requests are drawn for tenants in proportion to it
    pool: str | None = None
    policy: str | None = None  # its own routing policy
    policy_options: dict[str, Any] | None = None
    requests_per_s: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)
    max_concurrency: int | None = Field(default=None, ge=1)


class FailureSpec(_Strict):
    mtbf_s: float = Field(gt=0)  # mean time between failures of one replica process
    restart: bool = True  # the actuator restarts a crashed replica (after backoff + cold start)


class SimFleetSpec(_Strict):
    groups: tuple[GroupSpec, ...] = ()
    tenants: tuple[TenantSpecConfig, ...] = ()
    failures: FailureSpec | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=10)


def validate_sim_fleet(data: Any, source: str = "--config") -> SimFleetSpec:
    if not isinstance(data, dict):
        raise UserError("the top level must be a mapping", field=source,
                        fix="see `gpufleet sim --help` and docs/sim.md")  # fmt: skip
    try:
        spec = SimFleetSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or source
        fix = ("remove it or check its spelling" if err["type"] == "extra_forbidden"
               else "see the example in docs/sim.md")  # fmt: skip
        raise UserError(err["msg"], field=where, fix=fix) from None
    names = [g.name for g in spec.groups]
    if len(set(names)) != len(names):
        raise UserError(f"group names repeat: {names}", field="groups", fix="name each once")
    tenants = [t.name for t in spec.tenants]
    if len(set(tenants)) != len(tenants):
        raise UserError(f"tenant names repeat: {tenants}", field="tenants", fix="name each once")
    if spec.groups and sum(1 for g in spec.groups if g.autoscale) > 1:
        raise UserError("more than one group is autoscaled", field="groups[].autoscale",
                        fix="mark one group autoscale: true")  # fmt: skip
    pools = {g.pool for g in spec.groups} if spec.groups else {None}
    for i, t in enumerate(spec.tenants):
        if t.pool not in pools:
            raise UserError(f"no replica group serves pool {t.pool!r}", field=f"tenants.{i}.pool",
                            fix="add a group with that pool, or drop the tenant's pool")  # fmt: skip
    return spec


def load_sim_fleet(path: str | Path) -> SimFleetSpec:
    data, _ = load_yaml(path, "--config")  # the project's one YAML reader (errors name line:col)
    return validate_sim_fleet(data or {}, source=str(path))
