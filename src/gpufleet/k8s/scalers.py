"""`--scaler keda` / `--scaler hpa`: the `default` policy, translated as far as they go.

Signals (PromQL over what Prometheus scrapes from the gateways and the engines):
- demand = requests in flight from every gateway to the group's pods
  (`gpufleet_gateway_replica_in_flight`) + requests waiting at the gateways for a ready
  replica (`gpufleet_gateway_queue_depth`, the gateway's queue-depth metric; with several
  groups `gpufleet_gateway_queue_depth_by_model{model=...}`, the group's model's alone). Target per
  replica = capacity_per_replica / (1 + headroom_fraction): the policy's warm headroom.
  KEDA activates (0 → 1) on a queue depth above zero.
- mean KV-cache usage, target kv_usage_threshold (the policy's batch-saturation signal).
- TTFT p90 at the gateways, target ttft_p90_slo_s (when the policy has one).

Behaviour: scale up at once (no stabilization); scale down one pod per scale_in_cooldown_s,
on the highest recommendation of the last peak_window_s + scale_in_stabilization_s (the
policy's "N−1 must hold the recent peak, for a while").

What neither can express is written as a comment in the emitted file (NOT_EXPRESSIBLE).
"""

from __future__ import annotations

import math
from typing import Any

from gpufleet.errors import UserError
from gpufleet.fleet.config import AutoscaleSpec
from gpufleet.k8s.group import ReplicaGroup
from gpufleet.k8s.objects import Manifest, meta

NOT_EXPRESSIBLE = (
    "Not expressible here, unlike gpufleet's own controller (--scaler gpufleet):",
    "- the demand forecast one cold start ahead (a least-squares trend): KEDA and the HPA",
    "  act on the current value only, so a ramp is met one cold start late;",
    "- replicas still starting count as capacity arriving at their expected ready time:",
    "  here a starting pod counts as serving capacity at once (AverageValue divides by",
    "  all replicas), so a long load can under-provision while it lasts;",
    "- no scale-in while a replica is starting, and the capacity learned from replicas",
    "  that queue below the configured capacity_per_replica;",
    "- waiting requests must persist over several ticks before they count as saturation.",
    "The scale-in drain is the pods' preStop hook (the gpufleet controller, still",
    "running, registers pods with the gateways but no longer scales).",
)


def _policy(autoscale: AutoscaleSpec) -> dict[str, Any]:
    from gpufleet.autoscale.policies import make_policy

    policy = make_policy(autoscale.policy, autoscale.bounds(), autoscale.params)
    fields = ("capacity_per_replica", "headroom_fraction", "kv_usage_threshold",
              "ttft_p90_slo_s", "peak_window_s", "scale_in_stabilization_s",
              "scale_in_cooldown_s")  # fmt: skip
    defaults: dict[str, Any] = {
        "capacity_per_replica": 256,
        "headroom_fraction": 0.0,
        "kv_usage_threshold": None,
        "ttft_p90_slo_s": None,
        "peak_window_s": 60.0,
        "scale_in_stabilization_s": 0.0,
        "scale_in_cooldown_s": 30.0,
    }
    return {f: getattr(policy, f, defaults[f]) for f in fields}


def queries(group: ReplicaGroup) -> dict[str, str]:
    pods = f'replica=~"{group.name}-.*"'
    queue = "sum(gpufleet_gateway_queue_depth) or vector(0)"
    model = group.model
    if group.served_model is not None:
        # Several groups: this group's pods alone (a Deployment's <name>-<hash>-<id>, a
        # LeaderWorkerSet leader's <name>-<index>, so `llama` never matches `llama-70b`'s),
        # and the requests waiting for this group's model.
        pods = (
            f'replica=~"{group.name}-[0-9]+"'
            if group.multi_node
            else (f'replica=~"{group.name}-[a-z0-9]+-[a-z0-9]+"')
        )
        model = group.served_model
        queue = f'sum(gpufleet_gateway_queue_depth_by_model{{model="{model}"}}) or vector(0)'
    kv = (  # the engines label their metrics with the name they serve the model as
        f'sglang:token_usage{{model_name="{model}"}}'
        if group.engine == "sglang"
        else f'vllm:kv_cache_usage_perc{{model_name="{model}"}} '
        f'or vllm:gpu_cache_usage_perc{{model_name="{model}"}}'
    )
    return {
        "demand": f"(sum(gpufleet_gateway_replica_in_flight{{{pods}}}) or vector(0)) + ({queue})",
        "queue_depth": queue,
        "kv_usage": f"avg({kv})",
        "ttft_p90_s": "histogram_quantile(0.9, sum by (le) (rate("
        f'gpufleet_gateway_time_to_first_token_seconds_bucket{{model="{model}"}}[1m])))',
    }


def behavior(p: dict[str, Any], interval_s: float) -> Manifest:
    down_window = math.ceil(p["peak_window_s"] + p["scale_in_stabilization_s"])
    period = max(1, math.ceil(interval_s))
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": max(15, period)},
                {"type": "Pods", "value": 4, "periodSeconds": max(15, period)},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": min(3600, down_window),
            "selectPolicy": "Min",
            "policies": [
                {
                    "type": "Pods",
                    "value": 1,
                    "periodSeconds": max(1, math.ceil(p["scale_in_cooldown_s"])),
                }
            ],
        },
    }


def _targets(p: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """signal -> (HPA target type, value)."""
    out = {"demand": ("AverageValue", p["capacity_per_replica"] / (1.0 + p["headroom_fraction"]))}
    if p["kv_usage_threshold"] is not None:
        out["kv_usage"] = ("Value", float(p["kv_usage_threshold"]))
    if p["ttft_p90_slo_s"] is not None:
        out["ttft_p90_s"] = ("Value", float(p["ttft_p90_slo_s"]))
    return out


def _quantity(x: float) -> str:
    """A Kubernetes quantity: integers as is, fractions in milli-units."""
    return str(int(x)) if float(x).is_integer() else f"{round(x * 1000)}m"


def _target_ref(target_kind: str, target_api: str, name: str) -> Manifest:
    return {"apiVersion": target_api, "kind": target_kind, "name": name}


def keda_scaled_object(
    group: ReplicaGroup,
    autoscale: AutoscaleSpec,
    namespace: str,
    prometheus_url: str,
    target: tuple[str, str],
) -> Manifest:
    p = _policy(autoscale)
    q = queries(group)
    triggers: list[Manifest] = []
    for signal, (metric_type, value) in _targets(p).items():
        meta_: dict[str, str] = {
            "serverAddress": prometheus_url,
            "query": q[signal],
            "threshold": f"{value:g}",
        }
        if signal == "demand":
            # 0 → 1 when requests wait at a gateway for a replica (scale from zero).
            meta_["activationThreshold"] = "0"
        triggers.append(
            {"type": "prometheus", "name": signal.replace("_", "-"), "metricType": metric_type,
             "metadata": meta_}
        )  # fmt: skip
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": meta(group.name, namespace, "autoscaler", group.name),
        "spec": {
            "scaleTargetRef": _target_ref(target[0], target[1], group.name),
            "pollingInterval": max(1, math.ceil(autoscale.interval_s)),
            "cooldownPeriod": max(
                300, math.ceil(p["peak_window_s"] + p["scale_in_stabilization_s"])
            ),
            "minReplicaCount": autoscale.min_replicas,
            "maxReplicaCount": autoscale.max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "name": group.name,
                    "behavior": behavior(p, autoscale.interval_s),
                }
            },
            "triggers": triggers,
        },
    }


def hpa(
    group: ReplicaGroup,
    autoscale: AutoscaleSpec,
    namespace: str,
    target: tuple[str, str],
    where: str = "",
) -> Manifest:
    """where: "groups[i]." for a group of several, in errors."""
    if autoscale.min_replicas < 1:
        raise UserError(
            "an HPA cannot scale to zero (the HPAScaleToZero gate is alpha)",
            field=f"{where}autoscale.min_replicas",
            fix="set it to 1 or more, or use --scaler keda (or gpufleet) to scale from zero",
        )
    p = _policy(autoscale)
    metrics = []
    for signal, (target_type, value) in _targets(p).items():
        key = "averageValue" if target_type == "AverageValue" else "value"
        metrics.append(
            {
                "type": "External",
                "external": {
                    "metric": {"name": external_metric_name(group, signal)},
                    "target": {"type": target_type, key: _quantity(value)},
                },
            }
        )
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta(group.name, namespace, "autoscaler", group.name),
        "spec": {
            "scaleTargetRef": _target_ref(target[0], target[1], group.name),
            "minReplicas": autoscale.min_replicas,
            "maxReplicas": autoscale.max_replicas,
            "metrics": metrics,
            "behavior": behavior(p, autoscale.interval_s),
        },
    }


def external_metric_name(group: ReplicaGroup, signal: str) -> str:
    return f"gpufleet_{group.name.replace('-', '_')}_{signal}"


def _series(group: ReplicaGroup, signal: str) -> str:
    if signal == "demand":
        return "gpufleet_gateway_replica_in_flight"
    if signal == "ttft_p90_s":
        return "gpufleet_gateway_time_to_first_token_seconds_bucket"
    return "sglang:token_usage" if group.engine == "sglang" else "vllm:kv_cache_usage_perc"


def adapter_rules(group: ReplicaGroup, autoscale: AutoscaleSpec) -> list[str]:
    """prometheus-adapter `rules.external` entries that serve the HPA's external metrics."""
    q = queries(group)
    lines = ["rules:", "  external:"]
    for signal in _targets(_policy(autoscale)):
        lines += [
            f"  - seriesQuery: '{_series(group, signal)}'",
            f"    name: {{as: {external_metric_name(group, signal)}}}",
            f"    metricsQuery: '{q[signal]}'",
        ]
    return lines
