"""The replica group's objects: a Deployment (or a LeaderWorkerSet when a replica spans
nodes), its Service, and the model-cache claim.

Every engine pod: the plan's command; `nvidia.com/gpu` (or `amd.com/gpu`) = the GPUs of
the pod; a memory-backed /dev/shm (NCCL and the engine's worker processes share tensors
through it; Docker's 64 MiB default breaks multi-GPU replicas); the model cache as HF_HOME;
nodeSelector and toleration for the planned GPU board; probes on /health (startup sized
for the model's load time, then readiness and liveness); a termination grace period that
covers the drain deadline plus the engine's own shutdown, with a preStop hook
(`drain_hook.py`) that drains the pod at every gateway first.

`spec.replicas` is left out on purpose: the autoscaler (gpufleet's controller, KEDA or an
HPA) owns it, and `kubectl apply` of these files must not reset it.
"""

from __future__ import annotations

import math
import shlex
from importlib import resources

from gpufleet.k8s.group import ENGINE_PORT, RAY_PORT, ReplicaGroup
from gpufleet.k8s.objects import (
    ADMIN_SECRET,
    ADMIN_SECRET_KEY,
    GATEWAY_PEERS,
    GATEWAY_PORT,
    GROUP_LABEL,
    ROLE_LABEL,
    Manifest,
    env_field,
    env_secret,
    env_value,
    http_probe,
    meta,
    scrape_annotations,
    service,
)
from gpufleet.k8s.placement import STARTUP_PROBE_PERIOD_S
from gpufleet.k8s.settings import KubernetesSpec

ENGINE_STOP_S = 30  # SIGTERM to exit: the engine frees GPUs and NCCL communicators
LWS_API = "leaderworkerset.x-k8s.io/v1"


def drain_hook_source() -> str:
    return resources.files("gpufleet.k8s").joinpath("drain_hook.py").read_text()


def grace_period_s(drain_deadline_s: float) -> int:
    """≥ the drain deadline: the preStop hook's wait and the engine's exit both count."""
    return math.ceil(drain_deadline_s) + ENGINE_STOP_S


def shm_gib(group: ReplicaGroup, spec: KubernetesSpec) -> float:
    return spec.shm_gib or max(2.0, 4.0 * group.gpus_per_pod)


def _gib(x: float) -> str:
    return f"{math.ceil(x)}Gi"


def _volumes(group: ReplicaGroup, spec: KubernetesSpec) -> list[Manifest]:
    cache = spec.model_cache
    if cache.host_path:
        source: Manifest = {"hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}}
    else:
        source = {"persistentVolumeClaim": {"claimName": cache.pvc or cache_claim_name(group)}}
    return [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _gib(shm_gib(group, spec))}},
        {"name": "model-cache", **source},
    ]


def _env(
    group: ReplicaGroup, spec: KubernetesSpec, namespace: str, drain_s: float
) -> list[Manifest]:
    env = [
        env_field("POD_NAME", "metadata.name"),
        env_value("HF_HOME", spec.model_cache.mount_path),
    ]
    if spec.hf_token_secret:
        env.append(env_secret("HF_TOKEN", spec.hf_token_secret, "token", optional=True))
    env += [
        env_secret("GPUFLEET_ADMIN_KEY", ADMIN_SECRET, ADMIN_SECRET_KEY),
        env_value("GPUFLEET_GATEWAY_PEERS", f"{GATEWAY_PEERS}.{namespace}.svc:{GATEWAY_PORT}"),
        env_value("GPUFLEET_DRAIN_DEADLINE_S", f"{drain_s:g}"),
        env_value("GPUFLEET_ENGINE_URL", f"http://127.0.0.1:{ENGINE_PORT}"),
    ]
    return env


def _container(
    group: ReplicaGroup,
    spec: KubernetesSpec,
    namespace: str,
    drain_s: float,
    command: list[str],
    serves_http: bool,
) -> Manifest:
    gpus = group.gpus_per_pod
    memory_gib = spec.memory_gib_per_gpu * gpus + shm_gib(group, spec)  # shm counts as memory
    container: Manifest = {
        "name": "engine",
        "image": spec.engine_image(),
        "imagePullPolicy": spec.image_pull_policy,
        "command": command,
        "env": _env(group, spec, namespace, drain_s),
        "resources": {
            "requests": {"cpu": f"{spec.cpu_per_gpu * gpus:g}", "memory": _gib(memory_gib)},
            "limits": {group.placement.resource: gpus},
        },
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "model-cache", "mountPath": spec.model_cache.mount_path},
        ],
    }
    if serves_http:
        container["ports"] = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
        container["startupProbe"] = http_probe(
            "/health", "http", STARTUP_PROBE_PERIOD_S, group.timing.probe_failure_threshold
        )
        container["readinessProbe"] = http_probe("/health", "http", 5, 3)
        container["livenessProbe"] = http_probe("/health", "http", 10, 6)
        container["lifecycle"] = {
            "preStop": {"exec": {"command": ["python3", "-c", drain_hook_source()]}}
        }
    return container


def _pod_spec(
    group: ReplicaGroup, spec: KubernetesSpec, container: Manifest, drain_s: float
) -> Manifest:
    return {
        "terminationGracePeriodSeconds": grace_period_s(drain_s),
        "nodeSelector": dict(group.placement.node_selector),
        "tolerations": list(group.placement.tolerations),
        "containers": [container],
        "volumes": _volumes(group, spec),
    }


def _pod_labels(group: ReplicaGroup, role: str | None = None) -> dict[str, str]:
    out = {GROUP_LABEL: group.name}
    if role:
        out[ROLE_LABEL] = role
    return out


def _template(group: ReplicaGroup, pod_spec: Manifest, role: str | None, scrape: bool) -> Manifest:
    metadata = meta(group.name, None, "replica", extra_labels=_pod_labels(group, role))
    del metadata["name"]
    if scrape:
        metadata["annotations"] = scrape_annotations(ENGINE_PORT)
    return {"metadata": metadata, "spec": pod_spec}


def _shell(script: str) -> list[str]:
    return ["/bin/bash", "-c", script]


def _shell_word(word: str) -> str:
    """Quoted for bash; `${LWS_...}` words in double quotes so the shell expands them."""
    return f'"{word}"' if "${LWS_" in word else shlex.quote(word)


def multi_node_commands(group: ReplicaGroup) -> tuple[list[str], list[str]]:
    """(leader, worker) commands of a replica that spans `nodes_per_replica` pods."""
    engine = " ".join(_shell_word(w) for w in group.argv)
    if group.engine == "sglang":
        return _shell(f"exec {engine}"), _shell(f"exec {engine}")
    gpus = group.gpus_per_pod * group.nodes_per_replica
    wait = (
        "until python3 -c \"import ray, sys; ray.init(address='auto', logging_level='ERROR'); "
        f"sys.exit(ray.cluster_resources().get('GPU', 0) < {gpus})\"; do sleep 5; done"
    )
    leader = (
        f"ray start --head --port={RAY_PORT} --num-gpus={group.gpus_per_pod} && "
        f"{wait} && exec {engine}"
    )
    worker = (
        f"ray start --address=${{LWS_LEADER_ADDRESS}}:{RAY_PORT} "
        f"--num-gpus={group.gpus_per_pod} --block"
    )
    return _shell(leader), _shell(worker)


def cache_claim_name(group: ReplicaGroup) -> str:
    return f"{group.name}-model-cache"


def group_objects(
    group: ReplicaGroup, spec: KubernetesSpec, namespace: str, drain_s: float
) -> list[Manifest]:
    """The workload (Deployment or LeaderWorkerSet), its Service and, when the cache is a
    new claim, the PersistentVolumeClaim."""
    out: list[Manifest] = []
    cache = spec.model_cache
    if not cache.pvc and not cache.host_path:
        size = cache.size_gib or math.ceil(group.checkpoint_bytes * 1.25 / (1 << 30))
        claim: Manifest = {
            "accessModes": [cache.access_mode],
            "resources": {"requests": {"storage": f"{size}Gi"}},
        }
        if cache.storage_class:
            claim["storageClassName"] = cache.storage_class
        out.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": meta(cache_claim_name(group), namespace, "model-cache", group.name),
                "spec": claim,
            }
        )
    selector = _pod_labels(group, "leader" if group.multi_node else None)
    if group.multi_node:
        out.append(_leader_worker_set(group, spec, namespace, drain_s))
    else:
        container = _container(group, spec, namespace, drain_s, list(group.argv), True)
        template = _template(group, _pod_spec(group, spec, container, drain_s), None, True)
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta(group.name, namespace, "replica"),
                "spec": {
                    "selector": {"matchLabels": selector},
                    # A new pod must be ready before an old one goes: no capacity dip.
                    "strategy": {
                        "type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                    },
                    "progressDeadlineSeconds": math.ceil(group.timing.budget_s) + 600,
                    "template": template,
                },
            }
        )
    out.append(service(group.name, namespace, "replica", selector, ENGINE_PORT))
    return out


def _leader_worker_set(
    group: ReplicaGroup, spec: KubernetesSpec, namespace: str, drain_s: float
) -> Manifest:
    leader_cmd, worker_cmd = multi_node_commands(group)
    leader = _container(group, spec, namespace, drain_s, leader_cmd, True)
    worker = _container(group, spec, namespace, drain_s, worker_cmd, False)
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": meta(group.name, namespace, "replica"),
        "spec": {
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": group.nodes_per_replica,
                # One lost pod breaks the replica's collectives: restart the whole group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _template(
                    group, _pod_spec(group, spec, leader, drain_s), "leader", True
                ),
                "workerTemplate": _template(
                    group, _pod_spec(group, spec, worker, drain_s), "worker", False
                ),
            },
        },
    }
