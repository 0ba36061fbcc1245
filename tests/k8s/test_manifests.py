"""The manifests for real plans: valid against the real schemas, and right for the plan
(GPUs per pod, the engine's command, probes sized for the load, drain before SIGTERM)."""

from __future__ import annotations

import ast
import copy
import functools
import math
import shlex
from typing import Any

import jsonschema
import pytest

from gpufleet.k8s.emit import ManifestFile, fleet_for_plan, render
from gpufleet.k8s.settings import validate_kubernetes
from gpufleet.plan.search import Plan, PlanRequest, plan
from gpufleet.specs import load_gpu, load_model

from .schemas import validate_manifest

PLANS = {
    "8b": ("meta-llama/Llama-3.1-8B", "h100-sxm", "auto"),
    "70b": ("meta-llama/Llama-3.1-70B", "h100-sxm", "bf16"),
    "405b": ("meta-llama/Llama-3.1-405B", "h100-sxm", "bf16"),
    "dsv3": ("deepseek-ai/DeepSeek-V3", "h200", "auto"),
    "dsv3-h100": ("deepseek-ai/DeepSeek-V3", "h100-sxm", "auto"),
}


@functools.cache
def the_plan(key: str) -> Plan:
    model, gpu, quant = PLANS[key]
    return plan(PlanRequest(model=load_model(model), gpu=load_gpu(gpu), quant=quant))


def manifests(key: str, scaler: str = "gpufleet", **k8s: Any) -> list[ManifestFile]:
    p = the_plan(key)
    spec = validate_kubernetes(k8s)
    return render(p, fleet_for_plan(p), spec, namespace="llm", scaler=scaler, admin_key="k")


def objects(files: list[ManifestFile]) -> list[dict[str, Any]]:
    return [o for f in files for o in f.objects]


def one(files: list[ManifestFile], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objects(files) if o["kind"] == kind and name in (None, o["metadata"]["name"])
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def engine_pod(files: list[ManifestFile]) -> dict[str, Any]:
    """The pod spec that runs the engine's HTTP server (a Deployment's, or an LWS leader's)."""
    for o in objects(files):
        if o["kind"] == "LeaderWorkerSet":
            return o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
        if (
            o["kind"] == "Deployment"
            and o["metadata"]["labels"]["app.kubernetes.io/component"] == "replica"
        ):
            return o["spec"]["template"]["spec"]
    raise AssertionError("no engine workload")


@pytest.mark.parametrize("scaler", ["gpufleet", "keda", "hpa"])
@pytest.mark.parametrize("key", sorted(PLANS))
def test_every_manifest_validates_against_its_schema(key: str, scaler: str) -> None:
    files = manifests(key, scaler)
    kinds = {o["kind"] for o in objects(files)}
    assert {"Namespace", "Secret", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
            "ServiceAccount", "Role", "RoleBinding"} <= kinds  # fmt: skip
    assert ("ScaledObject" in kinds) == (scaler == "keda")
    assert ("HorizontalPodAutoscaler" in kinds) == (scaler == "hpa")
    for obj in objects(files):
        validate_manifest(obj)


def test_a_schema_violation_is_caught() -> None:
    """The validation can fail: a misspelt field in a native kind and in a CRD kind."""
    files = manifests("405b", "keda")
    deployment = one(files, "Deployment", "gpufleet-gateway")
    bad = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(Exception, match="replica"):
        validate_manifest(bad)
    lws = one(files, "LeaderWorkerSet")
    bad_lws = {**lws, "spec": {**lws["spec"], "startupPolicy": "Whenever"}}
    with pytest.raises(Exception, match="Whenever"):
        validate_manifest(bad_lws)
    so = one(files, "ScaledObject")
    bad_so = {**so, "spec": {**so["spec"], "minReplicas": 1}}
    with pytest.raises(Exception, match="minReplicas"):
        validate_manifest(bad_so)


def _with(obj: dict[str, Any], path: str, key: str, value: Any) -> dict[str, Any]:
    """A deep copy of `obj` with `key` set to `value` in the mapping at the dotted `path`
    (a number picks a list item)."""
    out = copy.deepcopy(obj)
    node: Any = out
    for part in path.split(".") if path else ():
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[key] = value
    return out


@pytest.mark.parametrize(
    ("kind", "path", "key", "value", "match"),
    [
        # LWS fields, each a documented name misspelt or a documented bound broken
        ("LeaderWorkerSet", "spec.leaderWorkerTemplate", "sizes", 2, "sizes"),
        ("LeaderWorkerSet", "spec.leaderWorkerTemplate", "size", 0, "minimum of 1"),
        ("LeaderWorkerSet", "spec.leaderWorkerTemplate", "restartPolicy", "Always", "Always"),
        ("LeaderWorkerSet", "spec", "networkConfig", {"subdomainPolicy": "Unique"}, "Unique"),
        ("LeaderWorkerSet", "spec", "rolloutStrategy", {"type": "Recreate"}, "Recreate"),
        # the pod templates are Kubernetes' PodTemplateSpec, checked strictly
        ("LeaderWorkerSet", "spec.leaderWorkerTemplate.workerTemplate.spec", "nodeSelectors",
         {}, "nodeSelectors"),
        ("LeaderWorkerSet", "spec.leaderWorkerTemplate.leaderTemplate.spec.containers.0",
         "readinessProbes", {}, "readinessProbes"),
        ("LeaderWorkerSet", "metadata", "label", {}, "label"),
        # KEDA: nested fields, and a null the API server would prune silently
        ("ScaledObject", "spec.triggers.0", "metricTyp", "Value", "metricTyp"),
        ("ScaledObject", "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown",
         "stabilizationWindow", 60, "stabilizationWindow"),
        ("ScaledObject", "spec.scaleTargetRef", "name", 7, "7"),
        ("ScaledObject", "spec", "cooldownPeriod", None, "None"),
    ],
)  # fmt: skip
def test_a_crd_schema_violation_is_caught(
    kind: str, path: str, key: str, value: Any, match: str
) -> None:
    """Our LWS schema and the KEDA models' schema reject what a strict API server would."""
    obj = one(manifests("405b", "keda"), kind)
    validate_manifest(obj)
    with pytest.raises(jsonschema.ValidationError, match=match):
        validate_manifest(_with(obj, path, key, value))


def _engine(pod: dict[str, Any]) -> dict[str, Any]:
    [container] = pod["containers"]
    return container


def _argv(container: dict[str, Any]) -> list[str]:
    cmd = container["command"]
    return shlex.split(cmd[2]) if cmd[:2] == ["/bin/bash", "-c"] else list(cmd)


def _common_pod_checks(files: list[ManifestFile], gpus: int, product: str) -> dict[str, Any]:
    pod = engine_pod(files)
    c = _engine(pod)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": gpus}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": product}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert "persistentVolumeClaim" in volumes["model-cache"]
    assert {"name": "HF_HOME", "value": "/models"} in c["env"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    # Drain before SIGTERM, within the grace period.
    drain_s = float(next(e["value"] for e in c["env"] if e["name"] == "GPUFLEET_DRAIN_DEADLINE_S"))
    assert pod["terminationGracePeriodSeconds"] >= drain_s
    hook = c["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python3", "-c"]
    ast.parse(hook[2])  # the hook is valid Python
    return c


def _startup_allows_s(c: dict[str, Any]) -> float:
    probe = c["startupProbe"]
    return float(probe["periodSeconds"] * probe["failureThreshold"])


def test_llama_8b_one_gpu_deployment() -> None:
    files = manifests("8b")
    c = _common_pod_checks(files, 1, "NVIDIA-H100-80GB-HBM3")
    argv = _argv(c)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3.1-8B"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert "--pipeline-parallel-size" not in argv
    assert not [o for o in objects(files) if o["kind"] == "LeaderWorkerSet"]
    # 16 GB at 1 GB/s + 120 s init = 136 s expected; the probe allows twice, at least 300 s.
    assert _startup_allows_s(c) == 300
    group = _group(files)
    svc = one(files, "Service", group)
    template_labels = one(files, "Deployment", group)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= template_labels.items()


def _group(files: list[ManifestFile]) -> str:
    return next(f.name[3:-5] for f in files if f.name.startswith("20-"))


def test_llama_70b_tp4_deployment() -> None:
    files = manifests("70b")
    c = _common_pod_checks(files, 4, "NVIDIA-H100-80GB-HBM3")
    argv = _argv(c)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3.1-70B"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert "--distributed-executor-backend" not in argv
    # /dev/shm grows with the GPUs that share it.
    shm = next(v for v in engine_pod(files)["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["sizeLimit"] == "16Gi"


def test_llama_405b_bf16_spans_two_nodes_as_a_leader_worker_set() -> None:
    files = manifests("405b")
    lws = one(files, "LeaderWorkerSet")
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2  # PP=2: one pod per node
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = _common_pod_checks(files, 8, "NVIDIA-H100-80GB-HBM3")
    script = leader["command"][2]
    assert script.startswith("ray start --head --port=6379 --num-gpus=8 && ")
    assert "< 16)" in script  # waits for the 16 GPUs of both nodes
    argv = shlex.split(script.split("exec ", 1)[1])
    assert argv[:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3.1-405B"]
    for flag, value in (("--tensor-parallel-size", "8"), ("--pipeline-parallel-size", "2"),
                        ("--distributed-executor-backend", "ray")):  # fmt: skip
        assert argv[argv.index(flag) + 1] == value
    worker = _engine(lwt["workerTemplate"]["spec"])
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert (
        worker["command"][2]
        == "ray start --address=${LWS_LEADER_ADDRESS}:6379 --num-gpus=8 --block"
    )
    assert "readinessProbe" not in worker and "lifecycle" not in worker
    # Each node loads its own stage (~406 GB at 1 GB/s + 120 s): the probe allows ≥ 2×.
    assert _startup_allows_s(leader) >= 2 * (406 + 120)
    assert _startup_allows_s(leader) > 3 * _startup_allows_s(_engine(engine_pod(manifests("8b"))))
    # The Service and the controller address the leaders, whose scale-in is ordered.
    svc = one(files, "Service", lws["metadata"]["name"])
    assert svc["spec"]["selector"]["gpufleet.io/role"] == "leader"
    import yaml

    cfg = yaml.safe_load(one(files, "ConfigMap", "gpufleet-controller")["data"]["controller.yaml"])
    assert cfg["target"]["kind"] == "LeaderWorkerSet" and cfg["target"]["ordered_scale_in"]


def test_deepseek_v3_on_h200_is_one_eight_gpu_pod_and_on_h100_two_nodes() -> None:
    files = manifests("dsv3")
    c = _common_pod_checks(files, 8, "NVIDIA-H200")
    argv = _argv(c)
    assert argv[:3] == ["vllm", "serve", "deepseek-ai/DeepSeek-V3"]
    # One 8-GPU pod: TP, or attention DP x TP with the experts spread by EP (the planner's
    # DP-attention layouts for large MoE), whichever the plan chose.
    tp = int(argv[argv.index("--tensor-parallel-size") + 1])
    dp = int(argv[argv.index("--data-parallel-size") + 1]) if "--data-parallel-size" in argv else 1
    assert tp * dp == 8
    assert dp == 1 or "--enable-expert-parallel" in argv
    assert "--quantization" not in argv  # the checkpoint is fp8 already
    h100 = manifests("dsv3-h100")
    assert one(h100, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["size"] == 2
    _common_pod_checks(h100, 8, "NVIDIA-H100-80GB-HBM3")
    # The model cache holds the fp8 checkpoint (~690 GB) with room to spare.
    claim = next(o for o in objects(files) if o["kind"] == "PersistentVolumeClaim")
    size_gib = int(claim["spec"]["resources"]["requests"]["storage"].removesuffix("Gi"))
    assert 650 < size_gib < 1000


def test_sglang_multi_node_runs_one_rank_per_pod() -> None:
    files = manifests("405b", engine="sglang")
    lwt = one(files, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    for template in ("leaderTemplate", "workerTemplate"):
        script = _engine(lwt[template]["spec"])["command"][2]
        assert script.startswith("exec python3 -m sglang.launch_server --model-path ")
        assert '--node-rank "${LWS_WORKER_INDEX}"' in script
        assert '--dist-init-addr "${LWS_LEADER_ADDRESS}:5000"' in script
        assert "--nnodes 2" in script and "--tp-size 8" in script
        assert "--enable-metrics" in script  # SGLang serves /metrics only when asked
    validate_manifest(one(files, "LeaderWorkerSet"))


def test_gateway_is_highly_available_and_scraped() -> None:
    files = manifests("8b")
    d = one(files, "Deployment", "gpufleet-gateway")
    assert d["spec"]["replicas"] >= 2
    ann = d["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8000"
    assert one(files, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    import yaml

    from gpufleet.gateway.config import validate_config

    config = yaml.safe_load(one(files, "ConfigMap", "gpufleet-gateway")["data"]["gateway.yaml"])
    assert validate_config(config).host == "0.0.0.0"
    assert "admin_key" not in config  # it comes from the Secret
    peers = one(files, "Service", "gpufleet-gateway-peers")
    assert peers["spec"]["clusterIP"] == "None"
    with pytest.raises(Exception, match="gateway_replicas"):
        validate_kubernetes({"gateway_replicas": 1})


def test_controller_rbac_is_what_it_needs_and_nothing_more() -> None:
    role = one(manifests("8b"), "Role")
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    assert grants == {
        ("apps", "deployments/scale", "get"), ("apps", "deployments/scale", "update"),
        ("apps", "deployments/scale", "patch"),
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch"),
        ("discovery.k8s.io", "endpointslices", "get"), ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
        ("coordination.k8s.io", "leases", "create"), ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "update"),
    }  # fmt: skip
    # Under KEDA the controller only registers and drains: no scale, no pod patches.
    keda_role = one(manifests("8b", "keda"), "Role")
    assert not any("deployments/scale" in r["resources"] for r in keda_role["rules"])
    assert all("patch" not in r["verbs"] for r in keda_role["rules"])
    lws_role = one(manifests("405b"), "Role")
    assert lws_role["rules"][0]["resources"] == ["leaderworkersets/scale"]


def test_startup_probe_budget_follows_load_bandwidth() -> None:
    slow = _startup_allows_s(_engine(engine_pod(manifests("70b", load_gbps=0.25))))
    fast = _startup_allows_s(_engine(engine_pod(manifests("70b", load_gbps=10.0))))
    weights_gb = 141.0  # 70B bf16
    assert slow >= 2 * (weights_gb / 0.25 + 120)
    assert fast == 300  # the floor
    assert math.isclose(slow, 2 * (weights_gb / 0.25 + 120), rel_tol=0.05)
