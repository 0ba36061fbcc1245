"""The controller's objects: ServiceAccount, Role and RoleBinding (what it needs, nothing
more), the ConfigMap with its config, and its Deployment.

One controller per model group (a fleet with `groups:` has several, each with its own
objects, Lease and Role). Two pods run; a coordination.k8s.io Lease lets one act at a time (the other takes over
within the lease duration when the leader dies). The Role grants:
- the replica workload's scale subresource: get, update, patch (not with a KEDA/HPA scaler);
- pods: get, list, watch, and patch (pod-deletion-cost and the drain mark) when it scales;
- endpointslices: get, list, watch (replicas and gateway pods);
- leases: create, and get/update of its own Lease only.
"""

from __future__ import annotations

from gpufleet.k8s.controller_config import ControllerConfig
from gpufleet.k8s.objects import (
    ADMIN_SECRET,
    ADMIN_SECRET_KEY,
    Manifest,
    env_field,
    env_secret,
    meta,
)
from gpufleet.k8s.settings import KubernetesSpec

CONFIG_PATH = "/etc/gpufleet/controller.yaml"


def role_rules(cfg: ControllerConfig) -> list[Manifest]:
    rules: list[Manifest] = []
    if cfg.scale:
        rules.append(
            {
                "apiGroups": [cfg.target.group],
                "resources": [f"{cfg.target.plural}/scale"],
                "resourceNames": [cfg.target.name],
                "verbs": ["get", "update", "patch"],
            }
        )
    pod_verbs = ["get", "list", "watch"] + (["patch"] if cfg.scale else [])
    rules += [
        {"apiGroups": [""], "resources": ["pods"], "verbs": pod_verbs},
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        },
        # `create` cannot be limited to a name (the object does not exist yet).
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [cfg.lease_name],
            "verbs": ["get", "update"],
        },
    ]
    return rules


def controller_objects(spec: KubernetesSpec, cfg: ControllerConfig) -> list[Manifest]:
    ns = cfg.namespace
    name = cfg.lease_name  # gpufleet-controller, or gpufleet-controller-<group> per group
    config_text = cfg.to_yaml()
    selector = {
        "app.kubernetes.io/component": "controller",
        "app.kubernetes.io/instance": name,
    }
    pod_meta = meta(name, None, "controller")
    del pod_meta["name"]
    container = {
        "name": "controller",
        "image": spec.gpufleet_image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["gpufleet", "controller", "k8s", "--config", CONFIG_PATH],
        "env": [
            env_field("POD_NAME", "metadata.name"),  # its identity in the Lease
            env_field("POD_NAMESPACE", "metadata.namespace"),
            env_secret("GPUFLEET_ADMIN_KEY", ADMIN_SECRET, ADMIN_SECRET_KEY),
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/gpufleet", "readOnly": True}],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": meta(name, ns, "controller"),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(name, ns, "controller"),
            "rules": role_rules(cfg),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(name, ns, "controller"),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(name, ns, "controller"),
            "data": {"controller.yaml": config_text},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(name, ns, "controller"),
            "spec": {
                "replicas": 2,  # one leads, one stands by (the Lease decides)
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": pod_meta,
                    "spec": {
                        "serviceAccountName": name,
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": name}}],
                    },
                },
            },
        },
    ]
