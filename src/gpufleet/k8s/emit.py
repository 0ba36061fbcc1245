"""From a plan (and the fleet YAML) to a directory of manifests for `kubectl apply -f DIR`.

Files, applied in name order:
  00-namespace.yaml       the namespace
  05-admin-secret.yaml    the gateways' admin key (generated unless gateway.admin_key is set)
  10-gateway.yaml         ConfigMap, Deployment, Service, peers Service, PodDisruptionBudget
  20-<group>.yaml         model-cache claim, Deployment or LeaderWorkerSet, Service
  30-controller.yaml      ServiceAccount, Role, RoleBinding, ConfigMap, Deployment
  40-autoscaler.yaml      KEDA ScaledObject or HPA (--scaler keda | hpa)

A fleet with `groups:` has a 20-<group>.yaml per group, and per group its own controller
(30-controller-<group>.yaml: its own workload, Lease and Role) and autoscaler
(40-autoscaler-<group>.yaml); the one gateway serves every group's model.
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path

from gpufleet.errors import UserError
from gpufleet.fleet.config import CAPACITY_POLICIES, AutoscaleSpec, FleetConfig, parse_fleet
from gpufleet.k8s.controller_config import ControllerConfig, ScaleTarget
from gpufleet.k8s.controller_objects import controller_objects
from gpufleet.k8s.fleet_groups import GroupInput, group_inputs
from gpufleet.k8s.gateway_objects import admin_secret, gateway_objects, gateway_yaml
from gpufleet.k8s.group import ReplicaGroup, replica_group
from gpufleet.k8s.manifest_files import GENERATED, Emitted, ManifestFile, to_yaml, write_manifests
from gpufleet.k8s.objects import CONTROLLER, labels
from gpufleet.k8s.scalers import NOT_EXPRESSIBLE, adapter_rules, hpa, keda_scaled_object
from gpufleet.k8s.settings import SCALERS, KubernetesSpec, check_name, validate_kubernetes
from gpufleet.k8s.workload import LWS_API, group_objects
from gpufleet.plan.search import Plan, PlanRequest, plan

__all__ = ["GENERATED", "Emitted", "ManifestFile", "deploy_fleet", "emit_plan", "render",
           "render_groups", "to_yaml", "write_manifests"]  # fmt: skip


def plan_for_fleet(fleet: FleetConfig, spec: KubernetesSpec) -> Plan:
    return plan_for_group(GroupInput(fleet.replicas, fleet.autoscale, spec))


def plan_for_group(gi: GroupInput) -> Plan:
    from gpufleet.specs import load_gpu, load_model

    o = gi.spec.plan
    return plan(
        PlanRequest(
            model=load_model(gi.replicas.model),
            gpu=load_gpu(gi.replicas.gpu),
            input_tokens=o.input_tokens,
            output_tokens=o.output_tokens,
            rps=o.rps,
            ttft_slo_s=o.ttft_slo_s,
            tpot_slo_s=o.tpot_slo_s,
            quant=o.quant,
            kv_dtype=o.kv_dtype,
            max_model_len=o.max_model_len,
            gpus_per_node=o.gpus_per_node,
        )
    )


def fleet_for_plan(p: Plan) -> FleetConfig:
    """`gpufleet plan --emit k8s`: the default policy between 1 replica and twice the
    plan's count (the plan sizes for --rps; the autoscaler follows the traffic there is)."""
    replicas = p.chosen.replicas or 1
    return parse_fleet(
        {
            "replicas": {"model": p.request.model.name, "gpu": p.request.gpu.name},
            "autoscale": {"min_replicas": 1, "max_replicas": max(2, 2 * replicas)},
        }
    )


def _autoscale_for(a: AutoscaleSpec, group: ReplicaGroup) -> AutoscaleSpec:
    """The group's autoscale section with what the plan knows filled in."""
    params = dict(a.params)
    if a.policy in CAPACITY_POLICIES and "capacity_per_replica" not in params:
        params["capacity_per_replica"] = group.capacity.sequences
        params.setdefault("capacity_source", group.capacity.source)
    if a.policy == "default":
        params.setdefault("cold_start_s", round(group.timing.expected_s, 1))
    return a.model_copy(update={"params": params})


def _check_tp(gi: GroupInput, p: Plan) -> None:
    if "tp" in gi.replicas.model_fields_set and gi.replicas.tp != p.chosen.layout.tp:
        plan_key = f"kubernetes.groups.{gi.spec.name}.plan" if gi.where else "kubernetes.plan"
        raise UserError(
            f"{gi.where}replicas.tp {gi.replicas.tp} differs from the plan's "
            f"{p.chosen.layout.label}",
            field=f"{gi.where}replicas.tp",
            fix=f"remove {gi.where}replicas.tp (the plan chooses the layout on Kubernetes), "
            f"or change {plan_key} (quant, max_model_len, gpus_per_node) to steer the plan",
        )


def render(
    p: Plan,
    fleet: FleetConfig,
    spec: KubernetesSpec,
    *,
    namespace: str,
    scaler: str,
    admin_key: str,
) -> list[ManifestFile]:
    """A single-group fleet's files (`fleet.replicas` planned as `p`)."""
    gi = GroupInput(fleet.replicas, fleet.autoscale, spec, served_model=fleet.replicas.model)
    return render_groups([(p, gi)], fleet, spec, namespace=namespace, scaler=scaler,
                         admin_key=admin_key)  # fmt: skip


def render_groups(
    planned: list[tuple[Plan, GroupInput]],
    fleet: FleetConfig,
    spec: KubernetesSpec,
    *,
    namespace: str,
    scaler: str,
    admin_key: str,
) -> list[ManifestFile]:
    if scaler not in SCALERS:
        raise UserError(f"unknown scaler {scaler!r}", field="--scaler", fix=" | ".join(SCALERS))
    check_name(namespace, "--namespace")
    several = bool(fleet.groups)  # a `groups:` list: files per group
    files: list[ManifestFile] = []
    summary: list[str] = []
    groups = []
    for p, gi in planned:
        group = replica_group(
            p, gi.spec, gi.replicas.args, gi.served_model if several else None, gi.served_model
        )
        groups.append(group)
        lines = _summary(p, group)
        summary += [f"[{group.name}] {line}" for line in lines] if several else lines
        files += _group_files(group, gi, namespace, scaler, several)
    summary.append(f"Scaler: {scaler}.")
    drain_s = max(gi.replicas.drain_deadline_s for _, gi in planned)
    files += [
        ManifestFile(
            "00-namespace.yaml",
            [
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": labels("namespace", namespace)},
                }
            ],
            summary,
        ),
        ManifestFile(
            "05-admin-secret.yaml",
            [admin_secret(namespace, admin_key)],
            [
                "The gateways' admin key: keep this file private, or delete it and create the",
                "Secret yourself (kubectl create secret generic gpufleet-admin --from-literal=admin-key=...).",
            ],
        ),
        ManifestFile(
            "10-gateway.yaml",
            gateway_objects(
                spec, namespace, gateway_yaml(fleet.gateway_settings(), groups[0].model), drain_s
            ),
        ),
    ]
    return sorted(files, key=lambda f: f.name)


def _group_files(
    group: ReplicaGroup, gi: GroupInput, namespace: str, scaler: str, several: bool
) -> list[ManifestFile]:
    """The group's workload file, its controller and (KEDA or HPA) its autoscaler."""
    spec, drain_s = gi.spec, gi.replicas.drain_deadline_s
    autoscale = _autoscale_for(gi.autoscale, group)
    target = (
        ScaleTarget(
            group="leaderworkerset.x-k8s.io", plural="leaderworkersets", kind="LeaderWorkerSet",
            name=group.name, ordered_scale_in=True,
        )
        if group.multi_node
        else ScaleTarget(name=group.name)
    )  # fmt: skip
    suffix = f"-{group.name}" if several else ""
    controller = ControllerConfig(
        namespace=namespace,
        group=group.name,
        target=target,
        scale=scaler == "gpufleet",
        autoscale=autoscale,
        drain_deadline_s=drain_s,
        expected_startup_s=round(group.timing.expected_s, 1),
        lease_name=CONTROLLER + suffix,
        lease=spec.lease,
        model=group.served_model,
    )
    files = [
        ManifestFile(
            f"20-{group.name}.yaml",
            group_objects(group, spec, namespace, drain_s),
            [f"Engine: {shlex.join(group.argv)}"]
            + (
                ["Needs the LeaderWorkerSet CRD and controller (kubernetes-sigs/lws)."]
                if group.multi_node
                else []
            ),
        ),
        ManifestFile(f"30-controller{suffix}.yaml", controller_objects(spec, controller)),
    ]
    kind_api = (target.kind, LWS_API if group.multi_node else "apps/v1")
    if scaler == "keda":
        obj = keda_scaled_object(group, autoscale, namespace, spec.prometheus_url, kind_api)
        files.append(
            ManifestFile(f"40-autoscaler{suffix}.yaml", [obj], ["Needs KEDA.", *NOT_EXPRESSIBLE])
        )
    elif scaler == "hpa":
        obj = hpa(group, autoscale, namespace, kind_api, gi.where)
        files.append(
            ManifestFile(
                f"40-autoscaler{suffix}.yaml",
                [obj],
                [
                    "Needs an external-metrics adapter; for prometheus-adapter (Helm values):",
                    *adapter_rules(group, autoscale),
                    "",
                    *NOT_EXPRESSIBLE,
                ],
            )
        )
    return files


def _summary(p: Plan, group: ReplicaGroup) -> list[str]:
    t = group.timing
    shape = (
        f"{group.nodes_per_replica} pods × {group.gpus_per_pod} GPUs (LeaderWorkerSet)"
        if group.multi_node
        else f"1 pod × {group.gpus_per_pod} GPUs (Deployment)"
    )
    return [
        f"{group.model} on {group.gpu}: {p.chosen.layout.label}; one replica = {shape}.",
        f"Start-up: {t.weights_bytes_per_pod / 1e9:.0f} GB of weights per pod at the configured "
        f"load_gbps = {t.load_s:.0f} s + {t.init_s:.0f} s engine init = {t.expected_s:.0f} s "
        f"expected; the startupProbe allows {t.budget_s:.0f} s.",
        f"Capacity per replica: {group.capacity.sequences} requests ({group.capacity.source}).",
    ]


def deploy_fleet(
    fleet: FleetConfig,
    out_dir: str | Path,
    *,
    namespace: str | None = None,
    scaler: str = "gpufleet",
    admin_key: str | None = None,
) -> Emitted:
    spec = validate_kubernetes(fleet.kubernetes)
    if spec.groups and not fleet.groups:
        raise UserError(
            "kubernetes.groups needs a fleet with `groups:`",
            field="kubernetes.groups",
            fix="set these keys in kubernetes: itself (one group)",
        )
    planned = []
    for gi in group_inputs(fleet, spec):
        p = plan_for_group(gi)
        _check_tp(gi, p)
        planned.append((p, gi))
    key = admin_key or fleet.gateway.get("admin_key") or secrets.token_urlsafe(24)
    files = render_groups(
        planned, fleet, spec, namespace=namespace or spec.namespace, scaler=scaler,
        admin_key=str(key),
    )  # fmt: skip
    return Emitted(write_manifests(out_dir, files), files[0].comments)


def emit_plan(
    p: Plan, out_dir: str | Path, *, namespace: str | None = None, scaler: str = "gpufleet"
) -> Emitted:
    """`gpufleet plan … --emit k8s DIR`: the plan's fleet with the default settings."""
    fleet = fleet_for_plan(p)
    spec = validate_kubernetes({})
    files = render(
        p, fleet, spec, namespace=namespace or spec.namespace, scaler=scaler,
        admin_key=secrets.token_urlsafe(24),
    )  # fmt: skip
    return Emitted(write_manifests(out_dir, files), files[0].comments)
