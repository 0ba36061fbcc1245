"""The gateway's objects: ConfigMap (its YAML), Secret (admin key), Deployment (≥ 2 pods),
Service, a headless peers Service, and a PodDisruptionBudget.

Gateways keep only soft state, so several stand side by side behind the Service. The
controller and the replicas' preStop hook reach every gateway pod through the headless
peers Service (one DNS record, and one EndpointSlice endpoint, per pod): a replica is
added to and drained from all of them, not just the one a ClusterIP happens to pick.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import yaml

from gpufleet.gateway.config import validate_config
from gpufleet.k8s.objects import (
    ADMIN_SECRET,
    ADMIN_SECRET_KEY,
    GATEWAY,
    GATEWAY_PEERS,
    GATEWAY_PORT,
    Manifest,
    env_secret,
    http_probe,
    meta,
    scrape_annotations,
    service,
)
from gpufleet.k8s.settings import KubernetesSpec

CONFIG_PATH = "/etc/gpufleet/gateway.yaml"
SELECTOR = {"app.kubernetes.io/component": "gateway", "app.kubernetes.io/instance": GATEWAY}


def gateway_yaml(settings: dict[str, Any], model: str) -> str:
    """The gateway's config file: the fleet's `gateway:` keys, listening on all addresses.
    Replicas are not listed: the controller registers each pod when it is ready."""
    data = {k: v for k, v in settings.items() if k != "admin_key"}  # the key is a Secret
    data["host"] = "0.0.0.0"
    data["port"] = GATEWAY_PORT
    data.setdefault("models", [model])
    validate_config(data, source="gateway")
    return yaml.safe_dump(data, sort_keys=True)


def admin_secret(namespace: str, admin_key: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(ADMIN_SECRET, namespace, "gateway", GATEWAY),
        "type": "Opaque",
        "stringData": {ADMIN_SECRET_KEY: admin_key},
    }


def gateway_objects(
    spec: KubernetesSpec, namespace: str, config_text: str, drain_s: float
) -> list[Manifest]:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(GATEWAY, namespace, "gateway"),
        "data": {"gateway.yaml": config_text},
    }
    digest = hashlib.sha256(config_text.encode()).hexdigest()[:16]
    annotations = {**scrape_annotations(GATEWAY_PORT), "gpufleet.io/config-sha256": digest}
    container = {
        "name": "gateway",
        "image": spec.gpufleet_image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["gpufleet", "gateway", "--config", CONFIG_PATH],
        "env": [env_secret("GPUFLEET_ADMIN_KEY", ADMIN_SECRET, ADMIN_SECRET_KEY)],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "readinessProbe": http_probe("/health", "http", 5, 3),
        "livenessProbe": http_probe("/health", "http", 10, 6),
        # Let the Service stop sending new connections before the process stops.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/gpufleet", "readOnly": True}],
    }
    pod_meta = meta(GATEWAY, None, "gateway", annotations=annotations)
    del pod_meta["name"]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(GATEWAY, namespace, "gateway"),
        "spec": {
            "replicas": spec.gateway_replicas,
            "selector": {"matchLabels": dict(SELECTOR)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": pod_meta,
                "spec": {
                    # Streams in flight finish (up to the replicas' drain deadline).
                    "terminationGracePeriodSeconds": math.ceil(drain_s) + 10,
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {"matchLabels": dict(SELECTOR)},
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                }
                            ]
                        }
                    },
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": GATEWAY}}],
                },
            },
        },
    }
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(GATEWAY, namespace, "gateway"),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": dict(SELECTOR)}},
    }
    return [
        config_map,
        deployment,
        service(
            GATEWAY,
            namespace,
            "gateway",
            dict(SELECTOR),
            GATEWAY_PORT,
            instance=GATEWAY,
            service_type=spec.gateway_service_type,
        ),
        service(
            GATEWAY_PEERS,
            namespace,
            "gateway",
            dict(SELECTOR),
            GATEWAY_PORT,
            instance=GATEWAY,
            headless=True,
        ),
        pdb,
    ]
