"""`gpufleet deploy k8s` of a fleet with `groups:` (docs/multi-model.md): per group its plan,
workload, Service, controller and autoscaler; one gateway for every group's model."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.errors import UserError
from gpufleet.fleet.config import parse_fleet
from gpufleet.k8s.controller_config import validate_controller_config
from gpufleet.k8s.emit import deploy_fleet

from .schemas import validate_manifest

LLAMA, QWEN = "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B"
# docs/multi-model.md's example, as deploy k8s reads it.
TWO_GROUPS: dict[str, Any] = {
    "gateway": {"policy": "queue_depth", "queue": {"max_size": 256, "timeout_s": 60}},
    "groups": [
        {
            "name": "llama",
            "replicas": {"model": LLAMA, "engine": "vllm", "gpu": "h100-sxm", "tp": 1,
                         "args": "--max-num-seqs 64"},
            "autoscale": {"policy": "default", "min_replicas": 1, "max_replicas": 4,
                          "params": {"ttft_p90_slo_s": 0.5}},
            "traffic": {"rps": 30, "input_tokens": 1024, "output_tokens": 256},
        },
        {
            "name": "qwen",
            "replicas": {"model": QWEN, "engine": "sglang", "gpu": "h100-sxm", "tp": 1},
            "autoscale": {"policy": "default", "min_replicas": 0, "max_replicas": 2},
            "queue": {"max_size": 32, "timeout_s": 120, "retry_after_s": 10},
            "traffic": {"rps": 2},
        },
    ],
}  # fmt: skip


def emit(tmp_path: Path, data: dict[str, Any], scaler: str = "gpufleet") -> dict[str, list[Any]]:
    """File name → its objects, as written."""
    deploy_fleet(parse_fleet(data), tmp_path, scaler=scaler, admin_key="k")
    return {
        p.name: [d for d in yaml.safe_load_all(p.read_text()) if d]
        for p in sorted(tmp_path.glob("*.yaml"))
    }


def with_groups(**changes: dict[str, Any]) -> dict[str, Any]:
    """TWO_GROUPS with group keys changed: with_groups(qwen={"autoscale": {...}})."""
    data = copy.deepcopy(TWO_GROUPS)
    for g in data["groups"]:
        for key, value in changes.get(g["name"], {}).items():
            g[key] = {**g[key], **value} if isinstance(g.get(key), dict) else value
    return data


def of_kind(files: dict[str, list[Any]], kind: str) -> dict[str, Any]:
    return {o["metadata"]["name"]: o for objs in files.values() for o in objs if o["kind"] == kind}


def controller_config(files: dict[str, list[Any]], group: str) -> Any:
    [cm] = [o for o in files[f"30-controller-{group}.yaml"] if o["kind"] == "ConfigMap"]
    return validate_controller_config(yaml.safe_load(cm["data"]["controller.yaml"]))


def engine_argv(files: dict[str, list[Any]], group: str) -> list[str]:
    [d] = [o for o in files[f"20-{group}.yaml"] if o["kind"] == "Deployment"]
    argv: list[str] = d["spec"]["template"]["spec"]["containers"][0]["command"]
    return argv


@pytest.mark.parametrize("scaler", ["gpufleet", "keda", "hpa"])
def test_two_groups_emit_valid_manifests_one_workload_and_service_each(
    tmp_path: Path, scaler: str
) -> None:
    data = with_groups(qwen={"autoscale": {"min_replicas": 1}}) if scaler == "hpa" else TWO_GROUPS
    files = emit(tmp_path, data, scaler)
    per_group = ["20-{}.yaml", "30-controller-{}.yaml"] + (
        ["40-autoscaler-{}.yaml"] if scaler != "gpufleet" else []
    )
    assert sorted(files) == sorted(
        ["00-namespace.yaml", "05-admin-secret.yaml", "10-gateway.yaml"]
        + [f.format(g) for f in per_group for g in ("llama", "qwen")]
    )
    every = [o for objs in files.values() for o in objs]
    for obj in every:
        validate_manifest(obj)
    keys = [(o["kind"], o["metadata"]["name"]) for o in every]
    assert len(keys) == len(set(keys)), "two objects of one kind share a name"
    workloads = {
        n: d for n, d in of_kind(files, "Deployment").items()
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "replica"
    }  # fmt: skip
    assert set(workloads) == {"llama", "qwen"}
    services = of_kind(files, "Service")
    for name, d in workloads.items():
        assert services[name]["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
        assert d["spec"]["selector"]["matchLabels"] == {"gpufleet.io/group": name}
    assert {o["metadata"]["name"] for o in of_kind(files, "PersistentVolumeClaim").values()} == {
        "llama-model-cache", "qwen-model-cache"
    }  # fmt: skip


def test_the_gateway_serves_every_groups_model_with_each_groups_queue(tmp_path: Path) -> None:
    files = emit(tmp_path, TWO_GROUPS)
    cfg = yaml.safe_load(of_kind(files, "ConfigMap")["gpufleet-gateway"]["data"]["gateway.yaml"])
    assert cfg["models"] == [LLAMA, QWEN]
    assert cfg["queue"]["models"] == {QWEN: {"max_size": 32, "timeout_s": 120, "retry_after_s": 10}}
    assert cfg["policy"] == "queue_depth"


def test_each_group_is_planned_with_its_engine_traffic_and_slo(tmp_path: Path) -> None:
    files = emit(tmp_path, TWO_GROUPS)
    llama, qwen = engine_argv(files, "llama"), engine_argv(files, "qwen")
    assert llama[:2] == ["vllm", "serve"] and "--max-num-seqs" in llama
    # The catalog knows Llama as Meta-Llama-3.1-8B; the gateway lists the config's name.
    assert llama[llama.index("--served-model-name") + 1] == LLAMA
    assert qwen[:3] == ["python3", "-m", "sglang.launch_server"]
    assert "--served-model-name" not in qwen  # the same name
    summary = (tmp_path / "00-namespace.yaml").read_text()
    assert "[llama] meta-llama/Meta-Llama-3.1-8B on h100-sxm" in summary
    assert "[qwen] Qwen/Qwen3-8B on h100-sxm" in summary
    # Each group's policy: its bounds, its SLO, capacity from its own plan.
    lc, qc = controller_config(files, "llama"), controller_config(files, "qwen")
    assert (lc.autoscale.min_replicas, lc.autoscale.max_replicas) == (1, 4)
    assert (qc.autoscale.min_replicas, qc.autoscale.max_replicas) == (0, 2)
    assert lc.autoscale.params["ttft_p90_slo_s"] == 0.5
    assert lc.autoscale.params["capacity_per_replica"] == 64  # its --max-num-seqs
    assert qc.autoscale.params["capacity_per_replica"] != 64


def test_each_controller_drives_its_own_group_with_least_privilege(tmp_path: Path) -> None:
    files = emit(tmp_path, TWO_GROUPS)
    roles = of_kind(files, "Role")
    assert set(roles) == {"gpufleet-controller-llama", "gpufleet-controller-qwen"}
    for group, model in (("llama", LLAMA), ("qwen", QWEN)):
        cfg = controller_config(files, group)
        name = f"gpufleet-controller-{group}"
        assert (cfg.group, cfg.target.name, cfg.model, cfg.lease_name) == (
            group, group, model, name
        )  # fmt: skip
        named = {(r["resources"][0], n) for r in roles[name]["rules"]
                 for n in r.get("resourceNames", [])}  # fmt: skip
        assert named == {("deployments/scale", group), ("leases", name)}
        binding = of_kind(files, "RoleBinding")[name]
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"][0]["name"] == name
        deployment = of_kind(files, "Deployment")[name]
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == name
        assert pod["volumes"][0]["configMap"]["name"] == name


def test_each_scaler_targets_its_group_on_its_models_queue(tmp_path: Path) -> None:
    files = emit(tmp_path, TWO_GROUPS, "keda")
    for group, model in (("llama", LLAMA), ("qwen", QWEN)):
        [so] = files[f"40-autoscaler-{group}.yaml"]
        assert so["spec"]["scaleTargetRef"]["name"] == group
        demand = next(t for t in so["spec"]["triggers"] if t["name"] == "demand")["metadata"]
        query = demand["query"]
        assert f'gpufleet_gateway_queue_depth_by_model{{model="{model}"}}' in query
        assert f'replica=~"{group}-[a-z0-9]+-[a-z0-9]+"' in query
    [llama_so] = files["40-autoscaler-llama.yaml"]
    ttft = next(t for t in llama_so["spec"]["triggers"] if t["name"] == "ttft-p90-s")
    assert (
        f'model="{LLAMA}"' in ttft["metadata"]["query"] and ttft["metadata"]["threshold"] == "0.5"
    )
    hpa_files = emit(tmp_path, with_groups(qwen={"autoscale": {"min_replicas": 1}}), "hpa")
    metrics = {
        g: {m["external"]["metric"]["name"] for m in hpa_files[f"40-autoscaler-{g}.yaml"][0]
            ["spec"]["metrics"]}
        for g in ("llama", "qwen")
    }  # fmt: skip
    assert not metrics["llama"] & metrics["qwen"]
    assert "40-autoscaler-llama.yaml" in hpa_files and "30-controller.yaml" not in hpa_files


def test_a_group_spanning_nodes_is_a_leader_worker_set_with_its_own_target(
    tmp_path: Path,
) -> None:
    data = copy.deepcopy(TWO_GROUPS)
    data["groups"][0]["replicas"] = {"model": "meta-llama/Llama-3.1-405B", "engine": "vllm"}
    data["kubernetes"] = {"groups": {"llama": {"plan": {"quant": "bf16"}}}}
    files = emit(tmp_path, data, "keda")
    [lws] = [o for o in files["20-llama.yaml"] if o["kind"] == "LeaderWorkerSet"]
    for obj in files["20-llama.yaml"]:
        validate_manifest(obj)
    cfg = controller_config(files, "llama")
    assert (cfg.target.kind, cfg.target.name) == ("LeaderWorkerSet", "llama") and lws
    [so] = files["40-autoscaler-llama.yaml"]
    assert so["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
    assert 'replica=~"llama-[0-9]+"' in so["spec"]["triggers"][0]["metadata"]["query"]
    assert controller_config(files, "qwen").target.kind == "Deployment"


def test_kubernetes_groups_overrides_one_groups_settings(tmp_path: Path) -> None:
    data = copy.deepcopy(TWO_GROUPS)
    data["kubernetes"] = {
        "namespace": "llm",
        "model_cache": {"size_gib": 100},
        "groups": {"qwen": {"image": "lmsysorg/sglang:v0.5.2", "plan": {"max_model_len": 4096},
                            "model_cache": {"storage_class": "fast"}}},
    }  # fmt: skip
    files = emit(tmp_path, data)
    deployments = of_kind(files, "Deployment")
    images = {g: deployments[g]["spec"]["template"]["spec"]["containers"][0]["image"]
              for g in ("llama", "qwen")}  # fmt: skip
    assert images == {"llama": "vllm/vllm-openai:latest", "qwen": "lmsysorg/sglang:v0.5.2"}
    qwen = engine_argv(files, "qwen")
    assert qwen[qwen.index("--context-length") + 1] == "4096"
    llama = engine_argv(files, "llama")
    assert llama[llama.index("--max-model-len") + 1] != "4096"
    claims = of_kind(files, "PersistentVolumeClaim")
    assert claims["qwen-model-cache"]["spec"]["storageClassName"] == "fast"
    assert "storageClassName" not in claims["llama-model-cache"]["spec"]
    assert claims["qwen-model-cache"]["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert {o["metadata"]["namespace"] for objs in files.values() for o in objs
            if "namespace" in o["metadata"]} == {"llm"}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kubernetes": {"groups": {"mistral": {}}}}, "kubernetes.groups.mistral"),
        ({"kubernetes": {"groups": {"qwen": {"namespace": "x"}}}}, "kubernetes.groups.qwen.namespace"),
        ({"kubernetes": {"groups": {"qwen": {"cpu_per_gpu": -1}}}}, "kubernetes.groups.qwen.cpu_per_gpu"),
        ({"kubernetes": {"name": "chat"}}, "kubernetes.name"),
        ({"groups.1.replicas.engine": "tgi"}, "groups[1].replicas.engine"),
        ({"groups.1.name": "Llama"}, "groups[1].name"),
        ({"groups.0.replicas.tp": 2}, "groups[0].replicas.tp"),
    ],
)  # fmt: skip
def test_group_errors_name_the_field(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    data = copy.deepcopy(TWO_GROUPS)
    for key, value in change.items():
        if key.startswith("groups."):
            _, i, *path = key.split(".")
            node = data["groups"][int(i)]
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
        else:
            data[key] = value
    with pytest.raises(UserError) as err:
        deploy_fleet(parse_fleet(data), tmp_path, admin_key="k")
    assert err.value.field == field, str(err.value)


def test_kubernetes_groups_needs_groups(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        deploy_fleet(parse_fleet({"kubernetes": {"groups": {"x": {}}}}), tmp_path, admin_key="k")
    assert err.value.field == "kubernetes.groups"


def test_a_single_group_config_keeps_its_names(tmp_path: Path) -> None:
    files = emit(tmp_path, {"kubernetes": {"name": "chat"}}, "keda")
    assert sorted(files) == ["00-namespace.yaml", "05-admin-secret.yaml", "10-gateway.yaml",
                             "20-chat.yaml", "30-controller.yaml", "40-autoscaler.yaml"]  # fmt: skip
    assert set(of_kind(files, "Role")) == {"gpufleet-controller"}
    [cm] = [o for o in files["30-controller.yaml"] if o["kind"] == "ConfigMap"]
    assert "model" not in yaml.safe_load(cm["data"]["controller.yaml"])
    [so] = files["40-autoscaler.yaml"]
    assert "(sum(gpufleet_gateway_queue_depth) or vector(0))" in so["spec"]["triggers"][0][
        "metadata"]["query"]  # fmt: skip


def test_a_single_groups_engine_answers_to_the_name_the_gateway_lists(tmp_path: Path) -> None:
    """The catalog spells the model `meta-llama/Meta-Llama-3.1-8B`; the config (and so the
    gateway) `meta-llama/Llama-3.1-8B`: the engine must answer to the config's name, or every
    request the gateway forwards is a 404 at the engine. The fleet's own args stay last."""
    files = emit(tmp_path, {"replicas": {"model": "meta-llama/Llama-3.1-8B", "gpu": "h100-sxm",
                                         "args": "--max-num-seqs 64"},
                            "kubernetes": {"name": "chat"}})  # fmt: skip
    argv = engine_argv(files, "chat")
    assert argv[argv.index("--served-model-name") + 1] == "meta-llama/Llama-3.1-8B"
    assert argv[-2:] == ["--max-num-seqs", "64"]
    [cm] = [o for o in files["10-gateway.yaml"] if o["kind"] == "ConfigMap"]
    assert "meta-llama/Llama-3.1-8B" in yaml.safe_load(cm["data"]["gateway.yaml"])["models"]
