"""One replica group as Kubernetes sees it: pods per replica, GPUs per pod, the engine's
command, the start-up time and the autoscaler's capacity — all from the plan.

A replica that fits one node is one pod (a Deployment). One that spans nodes (PP stages
across nodes, as `gpufleet plan` lays out: one stage of TP GPUs per node) is a group of
pods, one per node (a LeaderWorkerSet): the leader runs the engine's HTTP server, the
workers join it (vLLM through a Ray cluster, SGLang through torch.distributed).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpufleet.k8s.placement import GpuPlacement, StartupTiming, gpu_placement, startup_timing
from gpufleet.k8s.settings import KubernetesSpec, slug
from gpufleet.plan.capacity import ReplicaCapacity, concurrent_sequences
from gpufleet.plan.memory import default_max_num_seqs, total_weight_bytes
from gpufleet.plan.search import Plan

ENGINE_PORT = 8000
RAY_PORT = 6379
SGLANG_DIST_PORT = 5000


@dataclass(frozen=True)
class ReplicaGroup:
    name: str
    model: str
    gpu: str
    engine: str  # vllm | sglang
    nodes_per_replica: int  # pods per replica: 1, or the PP stages when they span nodes
    gpus_per_pod: int
    argv: tuple[str, ...]  # the engine's command (the leader's when multi-node)
    placement: GpuPlacement
    timing: StartupTiming
    capacity: ReplicaCapacity
    checkpoint_bytes: float  # what the model cache holds
    # The model as the gateway names it, when the fleet has `groups:` (its signals and
    # metrics are this model's); None: a single-group fleet, whose gateway serves one model.
    served_model: str | None = None

    @property
    def multi_node(self) -> bool:
        return self.nodes_per_replica > 1

    @property
    def gpus_per_replica(self) -> int:
        return self.gpus_per_pod * self.nodes_per_replica


def _words(rendered: str) -> list[str]:
    """A rendered launch command (backslash-continued lines) as argv."""
    return shlex.split(rendered.replace("\\\n", " "))


def _flag(words: list[str], flag: str) -> str | None:
    for i, w in enumerate(words[:-1]):
        if w == flag:
            return words[i + 1]
    return None


def _set_flag(words: list[str], flag: str, value: str) -> list[str]:
    out = list(words)
    for i, w in enumerate(out[:-1]):
        if w == flag:
            out[i + 1] = value
            return out
    return [*out, flag, value]


def engine_argv(plan: Plan, engine: str, extra_args: str, multi_node: bool) -> list[str]:
    """The plan's launch command for `engine`, with the fleet's extra args appended.

    Multi-node SGLang: every pod runs the same command with its own --node-rank and the
    leader's address (LWS sets LWS_WORKER_INDEX and LWS_LEADER_ADDRESS; the shell reads them).
    """
    if engine == "sglang":
        words = _words(plan.launch.sglang)
        if words[:1] == ["python"]:
            words[0] = "python3"  # the images ship python3; `python` is not always there
        if "--enable-metrics" not in words:
            words.append("--enable-metrics")  # /metrics: the gateways' and drain hook's load signal
        if multi_node:
            words = _set_flag(words, "--node-rank", "${LWS_WORKER_INDEX}")
            words = _set_flag(
                words, "--dist-init-addr", f"${{LWS_LEADER_ADDRESS}}:{SGLANG_DIST_PORT}"
            )
    else:
        words = _words(plan.launch.vllm)
    return words + shlex.split(extra_args)


def _capacity(plan: Plan, argv: list[str]) -> ReplicaCapacity:
    """Requests one replica serves at once within the SLOs: the plan's SLO-meeting
    concurrency, capped by what its KV cache and max_num_seqs hold."""
    c, req = plan.chosen, plan.request
    given = _flag(argv, "--max-num-seqs") or _flag(argv, "--max-running-requests")
    max_num_seqs = int(given) if given else default_max_num_seqs(req.gpu)
    kv_bound = concurrent_sequences(
        max_num_seqs, c.memory.kv_capacity_tokens, req.input_tokens + req.output_tokens
    )
    source = (
        f"plan: min(max_num_seqs {max_num_seqs}, {c.memory.kv_capacity_tokens} KV tokens / "
        f"{req.input_tokens + req.output_tokens} per request)"
    )
    seqs = kv_bound
    perf = c.performance
    if perf is not None and perf.slo_met and perf.max_concurrency < kv_bound:
        seqs = perf.max_concurrency
        source = (
            f"plan: {seqs} in flight per replica meet the SLOs; the KV cache and "
            f"max_num_seqs {max_num_seqs} would hold {kv_bound}"
        )
    return ReplicaCapacity(max(1, seqs), source, max_num_seqs, c.memory.kv_capacity_tokens)


def replica_group(
    plan: Plan,
    spec: KubernetesSpec,
    extra_args: str = "",
    served_model: str | None = None,
    name_on_engine: str | None = None,
) -> ReplicaGroup:
    """`served_model`: the group's model in a `groups:` fleet (its controller and scaler
    follow that model); `name_on_engine`: what the engine answers to (default the same)."""
    layout = plan.chosen.layout
    req = plan.request
    multi_node = layout.num_gpus > req.node_gpus
    nodes = layout.pp if multi_node else 1
    gpus_per_pod = layout.tp if multi_node else layout.num_gpus
    argv = engine_argv(plan, spec.engine, extra_args, multi_node)
    name_on_engine = name_on_engine or served_model
    if name_on_engine and name_on_engine != req.model.name and "--served-model-name" not in argv:
        # The gateway lists the group's model as the config names it (the catalog may
        # know it by another name): the engine answers to that name too.
        user = len(shlex.split(extra_args))  # the fleet's own args stay last
        argv[len(argv) - user : len(argv) - user] = ["--served-model-name", name_on_engine]
    name = spec.name or slug(f"{spec.engine}-{req.model.name.rsplit('/', 1)[-1]}", 40)
    weights_per_pod = plan.chosen.memory.weights_bytes * gpus_per_pod
    return ReplicaGroup(
        name=name,
        model=req.model.name,
        gpu=req.gpu.name,
        engine=spec.engine,
        nodes_per_replica=nodes,
        gpus_per_pod=gpus_per_pod,
        argv=tuple(argv),
        placement=gpu_placement(req.gpu.name, spec),
        timing=startup_timing(weights_per_pod, spec),
        capacity=_capacity(plan, argv),
        checkpoint_bytes=total_weight_bytes(req.model, req.model.checkpoint_dtype),
        served_model=served_model,
    )
