"""The `kubernetes:` section of the fleet YAML, validated; every error names the field and the fix.

```yaml
kubernetes:
  namespace: llm
  engine: vllm                      # vllm | sglang
  image: vllm/vllm-openai:v0.10.1   # pin the engine version you tested
  gpufleet_image: registry.example.com/gpufleet:0.1.0
  model_cache: {size_gib: 200, storage_class: fast-rwx}   # or {pvc: my-claim}, {host_path: /mnt/models}
  load_gbps: 1.0                    # GB/s one pod reads weights at (sizes the startupProbe)
  plan: {quant: bf16, input_tokens: 2048, output_tokens: 512, rps: 20}
  groups:                           # with `groups:` in the fleet: one group's own settings
    qwen: {image: lmsysorg/sglang:v0.5.2, plan: {max_model_len: 32768}}
```
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet import __version__
from gpufleet.errors import UserError

SCALERS = ("gpufleet", "keda", "hpa")
ENGINE_IMAGES = {"vllm": "vllm/vllm-openai:latest", "sglang": "lmsysorg/sglang:latest"}
# Seconds an engine spends after its weights are in GPU memory and before /health passes:
# CUDA-graph capture, torch.compile (cached after the first start), KV-cache allocation.
# vLLM V1 logs 30-90 s for this on an 8-GPU replica; 120 s keeps a margin.
DEFAULT_ENGINE_INIT_S = 120.0
# GB/s one pod reads weights at from its model cache. A network volume (EFS, Filestore,
# NFS, CephFS) sustains roughly 0.5-2 GB/s per client, a local NVMe several GB/s, a first
# download from the Hugging Face Hub less: 1 GB/s is a middle guess. Set your own.
DEFAULT_LOAD_GBPS = 1.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelCache(_Strict):
    """Where pods keep downloaded weights (HF_HOME), so a restart does not download again."""

    pvc: str | None = None  # an existing claim to use (nothing is emitted for it)
    size_gib: int | None = Field(default=None, ge=1)  # default: the checkpoint × 1.25
    storage_class: str | None = None  # default: the cluster's default class
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"] = "ReadWriteMany"
    host_path: str | None = None  # a directory on each GPU node instead of a claim
    mount_path: str = "/models"


class PlanOptions(_Strict):
    """What `gpufleet plan` is asked (the same flags, as keys)."""

    input_tokens: int = Field(default=1024, ge=1)
    output_tokens: int = Field(default=256, ge=1)
    rps: float = Field(default=1.0, gt=0)
    ttft_slo_s: float = Field(default=1.0, gt=0)
    tpot_slo_s: float = Field(default=0.05, gt=0)
    quant: str = "auto"
    kv_dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=1)
    gpus_per_node: int | None = Field(default=None, ge=1)


class LeaseTiming(_Strict):
    """client-go's leader-election defaults (kube-controller-manager uses the same)."""

    lease_duration_s: float = Field(default=15.0, gt=0)
    renew_deadline_s: float = Field(default=10.0, gt=0)
    retry_period_s: float = Field(default=2.0, gt=0)


class KubernetesSpec(_Strict):
    namespace: str = "gpufleet"
    name: str | None = None  # the replica group's name; default: engine + model
    engine: Literal["vllm", "sglang"] = "vllm"
    image: str | None = None  # default: the engine's official image
    gpufleet_image: str = f"gpufleet:{__version__}"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    model_cache: ModelCache = Field(default_factory=ModelCache)
    hf_token_secret: str | None = "hf-token"  # Secret with key `token` (optional at runtime)
    gpu_product: str | None = None  # node label value; default: the catalog's board
    node_selector: dict[str, str] = Field(default_factory=dict)  # extra labels to require
    tolerations: list[dict[str, Any]] | None = None  # default: tolerate the GPU taint
    cpu_per_gpu: float = Field(default=4.0, gt=0)
    memory_gib_per_gpu: float = Field(default=16.0, gt=0)
    shm_gib: float | None = Field(default=None, gt=0)  # default: 4 GiB per GPU, at least 2
    load_gbps: float = Field(default=DEFAULT_LOAD_GBPS, gt=0)
    engine_init_s: float = Field(default=DEFAULT_ENGINE_INIT_S, ge=0)
    gateway_replicas: int = Field(default=2, ge=2)
    gateway_service_type: Literal["ClusterIP", "LoadBalancer", "NodePort"] = "ClusterIP"
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    plan: PlanOptions = Field(default_factory=PlanOptions)
    lease: LeaseTiming = Field(default_factory=LeaseTiming)
    # With `groups:`: a group's own settings over these, by group name (k8s/fleet_groups.py).
    groups: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def engine_image(self) -> str:
        return self.image or ENGINE_IMAGES[self.engine]


_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def check_name(value: str, field: str, max_len: int = 63) -> str:
    """A DNS-1035 label (Service and namespace names), or a UserError naming the field."""
    if len(value) > max_len or not _DNS_LABEL.match(value):
        raise UserError(
            f"{value!r} is not a valid Kubernetes name",
            field=field,
            fix=f"lowercase letters, digits and '-', starting with a letter, at most {max_len}",
        )
    return value


def slug(text: str, max_len: int) -> str:
    """`meta-llama/Meta-Llama-3.1-8B` → `meta-llama-3-1-8b`: a DNS label from free text."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not s or not s[0].isalpha():
        s = "m-" + s
    return s[:max_len].rstrip("-")


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: Any, source: str, fix: str) -> M:
    """`model` from plain data, or a UserError naming the first bad field and a fix."""
    if not isinstance(data, dict):
        raise UserError("must be a mapping", field=source, fix="write key: value pairs")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            fix = "remove it or check its spelling"
        raise UserError(err["msg"], field=f"{source}.{name}", fix=fix) from None


def validate_kubernetes(data: Any, source: str = "kubernetes") -> KubernetesSpec:
    spec = validated(KubernetesSpec, {} if data is None else data, source, "see docs/kubernetes.md")
    check_name(spec.namespace, f"{source}.namespace")
    if spec.name is not None:
        check_name(spec.name, f"{source}.name", max_len=40)
    cache = spec.model_cache
    if cache.pvc and cache.host_path:
        raise UserError(
            "pvc and host_path both set",
            field=f"{source}.model_cache",
            fix="keep one: an existing claim or a node directory",
        )
    t = spec.lease
    if not t.retry_period_s < t.renew_deadline_s < t.lease_duration_s:
        raise UserError(
            "needs retry_period_s < renew_deadline_s < lease_duration_s",
            field=f"{source}.lease",
            fix="e.g. 2, 10, 15 (client-go's defaults)",
        )
    return spec
