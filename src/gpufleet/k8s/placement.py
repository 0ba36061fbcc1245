"""Where a replica's pods run and how long they take to start.

- GPU placement: the extended resource to request (`nvidia.com/gpu`, `amd.com/gpu`), the
  node label that names the board (GPU Feature Discovery's `nvidia.com/gpu.product`), and
  the toleration for the usual GPU-node taint. The table is data/gpu_products.yaml.
- Start-up time: a pod is ready once its weights are read from the model cache and the
  engine has initialised: weight bytes / `load_gbps` + `engine_init_s`. The startupProbe
  allows twice that (and at least 5 minutes): a probe that gives up too early kills a pod
  that was loading fine, and it then starts again from zero.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from gpufleet.errors import UserError
from gpufleet.k8s.settings import KubernetesSpec

STARTUP_PROBE_PERIOD_S = 10
STARTUP_MARGIN = 2.0  # the probe allows this many times the expected start-up time
MIN_STARTUP_BUDGET_S = 300.0


@dataclass(frozen=True)
class GpuPlacement:
    resource: str  # the extended resource, e.g. nvidia.com/gpu
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]


@functools.cache
def _products() -> dict[str, dict[str, Any]]:
    text = resources.files("gpufleet.k8s").joinpath("data/gpu_products.yaml").read_text()
    table: dict[str, dict[str, Any]] = yaml.safe_load(text)["gpus"]
    return table


def gpu_placement(gpu_name: str, spec: KubernetesSpec) -> GpuPlacement:
    entry = _products().get(gpu_name)
    if entry is None:
        raise UserError(
            f"no Kubernetes node label known for GPU {gpu_name!r}",
            field="kubernetes.gpu_product",
            fix="set kubernetes.gpu_product to the value of your nodes' nvidia.com/gpu.product",
        )
    resource = str(entry["resource"])
    selector = {str(entry["label"]): spec.gpu_product or str(entry["product"])}
    selector.update(spec.node_selector)
    tolerations = (
        spec.tolerations
        if spec.tolerations is not None
        else [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}]
    )
    return GpuPlacement(resource, selector, tolerations)


@dataclass(frozen=True)
class StartupTiming:
    weights_bytes_per_pod: float
    load_s: float  # reading the weights at load_gbps
    init_s: float  # engine initialisation after the weights are in
    expected_s: float  # load + init: what the autoscaler assumes a cold start takes
    budget_s: float  # what the startupProbe allows before it restarts the container

    @property
    def probe_failure_threshold(self) -> int:
        return math.ceil(self.budget_s / STARTUP_PROBE_PERIOD_S)


def startup_timing(weights_bytes_per_pod: float, spec: KubernetesSpec) -> StartupTiming:
    load_s = weights_bytes_per_pod / (spec.load_gbps * 1e9)
    expected_s = load_s + spec.engine_init_s
    budget_s = max(MIN_STARTUP_BUDGET_S, STARTUP_MARGIN * expected_s)
    return StartupTiming(weights_bytes_per_pod, load_s, spec.engine_init_s, expected_s, budget_s)
