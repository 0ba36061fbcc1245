"""Names, labels and small builders every emitted object shares."""

from __future__ import annotations

from typing import Any

Manifest = dict[str, Any]

PART_OF = "gpufleet"
GROUP_LABEL = "gpufleet.io/group"  # the replica group a pod belongs to
ROLE_LABEL = "gpufleet.io/role"  # leader | worker, in a multi-node replica
GATEWAY = "gpufleet-gateway"
GATEWAY_PEERS = "gpufleet-gateway-peers"  # headless: one DNS record per gateway pod
GATEWAY_PORT = 8000
CONTROLLER = "gpufleet-controller"
ADMIN_SECRET = "gpufleet-admin"  # the gateway's admin key, key `admin-key`
ADMIN_SECRET_KEY = "admin-key"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DRAINING_SINCE = "gpufleet.io/draining-since"  # epoch seconds the controller began a drain


def labels(component: str, instance: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": PART_OF,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/instance": instance,
    }


def meta(
    name: str,
    namespace: str | None,
    component: str,
    instance: str | None = None,
    *,
    extra_labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Manifest:
    out: Manifest = {"name": name}
    if namespace is not None:
        out["namespace"] = namespace
    out["labels"] = {**labels(component, instance or name), **(extra_labels or {})}
    if annotations:
        out["annotations"] = annotations
    return out


def scrape_annotations(port: int, path: str = "/metrics") -> dict[str, str]:
    """The annotations Prometheus' usual kubernetes-pods scrape job keys on."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": path,
    }


def env_value(name: str, value: str) -> Manifest:
    return {"name": name, "value": value}


def env_field(name: str, field_path: str) -> Manifest:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def env_secret(name: str, secret: str, key: str, optional: bool = False) -> Manifest:
    ref: Manifest = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def http_probe(path: str, port: str, period_s: int, failures: int, timeout_s: int = 5) -> Manifest:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": timeout_s,
    }


def service(
    name: str,
    namespace: str,
    component: str,
    selector: dict[str, str],
    port: int,
    *,
    instance: str | None = None,
    headless: bool = False,
    service_type: str = "ClusterIP",
) -> Manifest:
    spec: Manifest = {
        "selector": selector,
        "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
    }
    if headless:
        spec["clusterIP"] = "None"
        # Every gateway pod, ready or not, gets drained: a pod that is not yet ready can
        # still hold a replica it was told about.
        spec["publishNotReadyAddresses"] = True
    else:
        spec["type"] = service_type
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(name, namespace, component, instance),
        "spec": spec,
    }
