"""What the in-cluster controller reads at start (`gpufleet controller k8s --config FILE`).

`gpufleet deploy k8s` writes it into the controller's ConfigMap (one controller per model
group); it names the replica group's workload (its scale subresource) and Service (its EndpointSlices), the gateways'
peers Service, the scaling policy with its parameters already derived from the plan, and
the Lease that keeps one controller acting at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.config_errors import load_yaml
from gpufleet.fleet.config import AutoscaleSpec
from gpufleet.k8s.objects import CONTROLLER, GATEWAY_PEERS, GATEWAY_PORT
from gpufleet.k8s.settings import LeaseTiming, validated


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScaleTarget(_Strict):
    """A workload with a scale subresource: /apis/{group}/{version}/namespaces/NS/{plural}/{name}/scale."""

    group: str = "apps"
    version: str = "v1"
    plural: str = "deployments"
    kind: str = "Deployment"
    name: str
    # StatefulSet-backed workloads (a LeaderWorkerSet's leaders) always remove the highest
    # ordinal on scale-in, whatever the pod-deletion-cost: drain that one.
    ordered_scale_in: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


class ControllerConfig(_Strict):
    namespace: str
    group: str  # the replica group's Service (EndpointSlices carry kubernetes.io/service-name)
    target: ScaleTarget
    engine_port: int = 8000
    gateway_peers: str = GATEWAY_PEERS
    gateway_port: int = GATEWAY_PORT
    scale: bool = True  # False: KEDA or an HPA owns the count; register and drain only
    autoscale: AutoscaleSpec = Field(default_factory=AutoscaleSpec)
    drain_deadline_s: float = Field(default=60.0, gt=0)
    expected_startup_s: float = Field(default=300.0, gt=0)
    lease_name: str = CONTROLLER  # also the name of the controller's objects
    lease: LeaseTiming = Field(default_factory=LeaseTiming)
    # A fleet with `groups:`: the group's model as the gateway names it. The controller
    # reads that model's signals only, registers its pods as serving it, and leaves the
    # other groups' replicas at the gateways alone. None: the gateways serve this group only.
    model: str | None = None

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        if data["model"] is None:
            del data["model"]  # a single-group config reads as it always has
        return yaml.safe_dump(data, sort_keys=True)


def validate_controller_config(data: Any, source: str = "controller config") -> ControllerConfig:
    cfg = validated(ControllerConfig, data, source, "regenerate it with gpufleet deploy k8s")
    from gpufleet.autoscale.policies import make_policy

    make_policy(cfg.autoscale.policy, cfg.autoscale.bounds(), cfg.autoscale.params)
    return cfg


def load_controller_config(path: str | Path) -> ControllerConfig:
    data, _ = load_yaml(path, "--config")  # the project's one YAML reader (errors name line:col)
    return validate_controller_config(data, source=str(path))
