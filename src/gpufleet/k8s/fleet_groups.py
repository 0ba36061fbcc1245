"""The model groups `gpufleet deploy k8s` emits: one for a single-group fleet, one per entry
of `groups:` otherwise (docs/multi-model.md).

A group of a `groups:` list is planned as a single-group fleet is, with its own inputs:
- its name (a DNS label: the group's `name`, else its model's last path part, slugged);
- its engine: `replicas.engine` when vllm or sglang, else `kubernetes.engine`;
- its plan: `kubernetes.plan`, then what its `traffic:` states (rps, tokens, SLOs; the TTFT
  SLO defaults to its autoscale `ttft_p90_slo_s`, as in `gpufleet plan --groups`);
- `kubernetes.groups.<name>`: any per-pod setting of `kubernetes:` for this group alone
  (image, model_cache, gpu_product, node_selector, plan, ...), over the fleet's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.errors import UserError
from gpufleet.fleet.config import AutoscaleSpec, FleetConfig, GroupSpec, ReplicaSpec
from gpufleet.k8s.settings import KubernetesSpec, slug, validate_kubernetes

K8S_ENGINES = ("vllm", "sglang")
# Settings of the fleet as a whole (one namespace, gateway, Prometheus, lease timing).
FLEET_WIDE = ("namespace", "name", "gpufleet_image", "gateway_replicas", "gateway_service_type",
              "prometheus_url", "lease", "groups")  # fmt: skip
_TRAFFIC_TO_PLAN = ("rps", "input_tokens", "output_tokens", "ttft_slo_s", "tpot_slo_s")


@dataclass(frozen=True)
class GroupInput:
    """What one group's manifests are made from."""

    replicas: ReplicaSpec
    autoscale: AutoscaleSpec
    spec: KubernetesSpec  # the `kubernetes:` settings for this group (its name set)
    where: str = ""  # "groups[1]." in a groups: list, for errors
    served_model: str | None = None  # the gateway's name for its model (the config's)


def group_inputs(fleet: FleetConfig, spec: KubernetesSpec) -> list[GroupInput]:
    if not fleet.groups:
        # The engine answers to the model as the config names it (the catalog may spell it
        # otherwise, e.g. Meta-Llama-3.1-8B), since the gateway lists the config's name.
        return [
            GroupInput(fleet.replicas, fleet.autoscale, spec, served_model=fleet.replicas.model)
        ]
    if spec.name is not None:
        raise UserError(
            "kubernetes.name names the one group of a single-group fleet",
            field="kubernetes.name",
            fix="remove it: with groups:, each group is named by its groups[i].name",
        )
    labels = {g.label for g in fleet.groups}
    for key in spec.groups:
        if key not in labels:
            raise UserError(
                f"no group is named {key!r}",
                field=f"kubernetes.groups.{key}",
                fix=f"one of: {', '.join(sorted(labels))}",
            )
    out: list[GroupInput] = []
    names: dict[str, str] = {}
    for i, g in enumerate(fleet.groups):
        gi = _group_input(fleet, g, f"groups[{i}].", spec.groups.get(g.label) or {})
        name = gi.spec.name or ""
        if name in names:
            raise UserError(
                f"{gi.where}name and {names[name]}name both become {name!r} on Kubernetes",
                field=f"{gi.where}name",
                fix="give the groups names that differ in letters or digits",
            )
        names[name] = gi.where
        out.append(gi)
    return out


def _group_input(fleet: FleetConfig, g: GroupSpec, where: str, own: dict[str, Any]) -> GroupInput:
    source = f"kubernetes.groups.{g.label}"
    if not isinstance(own, dict):
        raise UserError("must be a mapping", field=source, fix="write key: value pairs")
    for key in own:
        if key in FLEET_WIDE:
            raise UserError(
                f"{key} is set for the whole fleet",
                field=f"{source}.{key}",
                fix=f"set kubernetes.{key} instead (a group's name is groups[i].name)",
            )
    base = {k: v for k, v in fleet.kubernetes.items() if k != "groups"}
    merged: dict[str, Any] = {**base, **own}
    for key in ("model_cache", "node_selector"):  # one level deep: a group changes one key
        if isinstance(base.get(key), dict) and isinstance(own.get(key), dict):
            merged[key] = {**base[key], **own[key]}
    engine = g.replicas.engine
    if engine in K8S_ENGINES:
        merged["engine"] = engine
    elif engine != "auto":
        raise UserError(
            f"engine {engine!r} has no Kubernetes manifests here",
            field=f"{where}replicas.engine",
            fix=f"one of {', '.join(K8S_ENGINES)} (or auto: kubernetes.engine)",
        )
    merged["plan"] = {
        **dict(base.get("plan") or {}),
        **_traffic_plan(g),
        **dict(own.get("plan") or {}),
    }
    merged["name"] = slug(g.label, 40)
    spec = validate_kubernetes(merged, source=source)
    return GroupInput(g.replicas, g.autoscale, spec, where, served_model=g.replicas.model)


def _traffic_plan(g: GroupSpec) -> dict[str, Any]:
    """The plan options the group's `traffic:` states (unset keys leave kubernetes.plan's)."""
    t = g.traffic
    out = {k: getattr(t, k) for k in _TRAFFIC_TO_PLAN if k in t.model_fields_set}
    slo = g.autoscale.params.get("ttft_p90_slo_s")
    if out.get("ttft_slo_s") is None and isinstance(slo, int | float) and slo > 0:
        out["ttft_slo_s"] = float(slo)
    if out.get("ttft_slo_s") is None:
        out.pop("ttft_slo_s", None)
    return out
