"""Layout search with a decision trail (DESIGN.md: "Decision order").

1. Precision: keep the checkpoint's precision if it fits one GPU with a useful KV cache;
   otherwise quantize first — weights to fp8 (near-lossless; int4 only when asked for,
   since it costs accuracy), then the KV cache to fp8.
2. The smallest TP inside a node that fits with a useful KV cache.
3. PP across nodes, only when a whole node of TP is not enough.
4. Performance: the smallest fitting TP is kept unless it misses the SLOs or a larger TP
   gives clearly more SLO-meeting throughput per GPU (over-provisioned TPs are rejected
   with their all-reduce share of the decode step).
5. EP for MoE: experts split whole over the TP ranks when that serves more per GPU.
6. Replicas: as many copies of the layout as --rps needs at the SLO-meeting throughput.

Every option tried becomes a `Decision` that says in numbers why it was kept or rejected.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufleet.errors import UserError
from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.layout import Layout
from gpufleet.plan.memory import (
    GIB,
    MemoryBreakdown,
    default_max_num_seqs,
    memory_breakdown,
    sequences_that_fit,
)
from gpufleet.plan.perf_serving import (
    ServingPrediction,
    layout_step_model,
    max_serving_concurrency_within_slo,
    predict_serving,
)
from gpufleet.plan.render import LaunchCommands, render_launch_commands
from gpufleet.specs.gpus import GpuSpec
from gpufleet.specs.models import ModelSpec

# A KV cache is "useful" when it holds at least this many requests of input+output tokens
# at once: below that the GPU mostly re-reads weights for a handful of tokens.
MIN_USEFUL_CONCURRENCY = 16
BACKEND = "vllm"  # the engine whose scheduler and calibration the predictions use
MAX_NODES = 64  # how far the search looks for a fitting multi-node layout
DEFAULT_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class PlanRequest:
    model: ModelSpec
    gpu: GpuSpec
    input_tokens: int = 1024
    output_tokens: int = 256
    rps: float = 1.0
    ttft_slo_s: float = 1.0
    tpot_slo_s: float = 0.05
    gpus_per_node: int | None = None  # None: the GPU's usual node size
    quant: str = "auto"  # auto | bf16 | fp8 | int8 | int4
    kv_dtype: str = "auto"  # auto | bf16 | fp8
    max_model_len: int | None = None
    max_gpus: int | None = None
    gpu_price_per_hour_usd: float | None = None
    gpu_memory_utilization: float = 0.9

    @property
    def node_gpus(self) -> int:
        return self.gpus_per_node or self.gpu.gpus_per_node

    @property
    def price_per_gpu_hour_usd(self) -> float:
        if self.gpu_price_per_hour_usd is not None:
            return self.gpu_price_per_hour_usd
        return self.gpu.price_per_gpu_hour_usd

    @property
    def request_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def resolved_max_model_len(self) -> int:
        if self.max_model_len is not None:
            return self.max_model_len
        wanted = max(DEFAULT_MAX_MODEL_LEN, self.request_tokens)
        return min(wanted, self.model.max_position_embeddings)


@dataclass(frozen=True)
class Decision:
    step: str  # precision | tp | pp | performance | ep | replicas
    option: str
    kept: bool
    reason: str


@dataclass(frozen=True)
class LayoutPerformance:
    prefill_s: float  # one prompt alone
    ttft_s: float  # at the steady-state concurrency the traffic implies
    tpot_s: float
    steady_concurrency: int  # requests in flight per replica at --rps
    max_concurrency: int  # the most in flight per replica that still meets the SLOs
    max_requests_per_s: float  # per replica, within the SLOs
    max_output_tokens_per_s: float  # per replica, within the SLOs
    allreduce_share_of_decode: float  # of one decode step at max_concurrency
    slo_met: bool


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: MemoryBreakdown
    kv_concurrent_requests: int  # requests of input+output tokens the KV cache holds
    performance: LayoutPerformance | None = None
    replicas: int | None = None
    total_gpus: int | None = None
    cost_per_hour_usd: float | None = None
    cost_per_million_output_tokens_usd: float | None = None  # at --rps

    @property
    def nodes(self) -> int:
        return self.layout.pp  # a PP stage is one node of TP GPUs in this search

    @property
    def output_tokens_per_s_per_gpu(self) -> float:
        if self.performance is None or not self.performance.slo_met:
            return 0.0
        return self.performance.max_output_tokens_per_s / self.layout.num_gpus


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    decisions: tuple[Decision, ...]
    max_model_len: int
    launch: LaunchCommands
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        req = self.request
        return {
            "model": req.model.name,
            "gpu": req.gpu.name,
            "gpus_per_node": req.node_gpus,
            "traffic": {
                "input_tokens": req.input_tokens,
                "output_tokens": req.output_tokens,
                "rps": req.rps,
                "ttft_slo_s": req.ttft_slo_s,
                "tpot_slo_s": req.tpot_slo_s,
            },
            "max_model_len": self.max_model_len,
            "price_per_gpu_hour_usd": req.price_per_gpu_hour_usd,
            "chosen": _candidate_dict(self.chosen),
            "candidates": [_candidate_dict(c) for c in self.candidates],
            "decisions": [asdict(d) for d in self.decisions],
            "launch": asdict(self.launch),
            "warnings": list(self.warnings),
        }


def _candidate_dict(c: Candidate) -> dict[str, Any]:
    return {
        "layout": {**asdict(c.layout), "num_gpus": c.layout.num_gpus, "label": c.layout.label},
        "memory": c.memory.to_dict(),
        "kv_concurrent_requests": c.kv_concurrent_requests,
        "performance": asdict(c.performance) if c.performance else None,
        "replicas": c.replicas,
        "total_gpus": c.total_gpus,
        "cost_per_hour_usd": c.cost_per_hour_usd,
        "cost_per_million_output_tokens_usd": c.cost_per_million_output_tokens_usd,
    }


# ---- the performance model, behind one function --------------------------------------


def _serving(req: PlanRequest, layout: Layout, kv_concurrent_requests: int) -> LayoutPerformance:
    """TTFT / TPOT / SLO-meeting throughput of one replica, from gpufleet.perf.roofline
    (vLLM's scheduler limits; running requests capped by what the KV cache holds)."""
    isl, osl = req.input_tokens, req.output_tokens
    common: dict[str, Any] = dict(
        backend=BACKEND,
        max_num_seqs=default_max_num_seqs(req.gpu),
        kv_capacity_tokens=max(1, kv_concurrent_requests) * req.request_tokens,
    )
    step = layout_step_model(req.model, req.gpu, layout, backend=BACKEND)

    def at(concurrency: int) -> ServingPrediction:
        return predict_serving(
            req.model, req.gpu, layout, isl, osl, concurrency, step_model=step, **common
        )

    best = max_serving_concurrency_within_slo(
        req.model,
        req.gpu,
        layout,
        isl,
        osl,
        ttft_slo_s=req.ttft_slo_s,
        tpot_slo_s=req.tpot_slo_s,
        **common,
    )
    alone = at(1)
    if best is None:
        return LayoutPerformance(
            prefill_s=alone.prefill_s,
            ttft_s=alone.ttft_s,
            tpot_s=alone.tpot_s,
            steady_concurrency=1,
            max_concurrency=0,
            max_requests_per_s=0.0,
            max_output_tokens_per_s=0.0,
            allreduce_share_of_decode=_allreduce_share(step, 1, isl, osl),
            slo_met=False,
        )
    replicas = max(1, math.ceil(req.rps / best.requests_per_s))
    # Steady state at the traffic: the smallest concurrency that carries rps / replicas.
    lo, hi, steady = 1, best.concurrency, best
    while lo <= hi:
        mid = (lo + hi) // 2
        p = at(mid)
        if p.requests_per_s >= req.rps / replicas:
            steady, hi = p, mid - 1
        else:
            lo = mid + 1
    return LayoutPerformance(
        prefill_s=alone.prefill_s,
        ttft_s=steady.ttft_s,
        tpot_s=steady.tpot_s,
        steady_concurrency=steady.concurrency,
        max_concurrency=best.concurrency,
        max_requests_per_s=best.requests_per_s,
        max_output_tokens_per_s=best.output_tokens_per_s,
        allreduce_share_of_decode=_allreduce_share(step, best.concurrency, isl, osl),
        slo_met=True,
    )


def _allreduce_share(step_model: RooflineStepTimeModel, n: int, isl: int, osl: int) -> float:
    batch = StepBatch(num_decode=n, decode_context_tokens=int(n * (isl + osl / 2)))
    parts = step_model.breakdown_s(batch)
    return parts["allreduce_s"] / parts["total_s"] if parts["total_s"] > 0 else 0.0


# ---- search ----------------------------------------------------------------------------


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def _tokens(n: int) -> str:
    return f"{n / 1000:.0f}k" if n >= 10_000 else str(n)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _weight_ladder(req: PlanRequest) -> list[str]:
    if req.quant != "auto":
        return [req.quant]
    base = req.model.checkpoint_dtype
    return [base, "fp8"] if base == "bf16" else [base]


def _kv_ladder(req: PlanRequest) -> list[str]:
    return ["bf16", "fp8"] if req.kv_dtype == "auto" else [req.kv_dtype]


def _valid_tps(model: ModelSpec, node_gpus: int) -> list[int]:
    """Powers of two up to a node that split the attention heads evenly (vLLM requires
    heads % tp == 0, and KV heads divisible by tp or tp by KV heads)."""
    tps = []
    t = 1
    while t <= node_gpus:
        kv = model.num_kv_heads
        if model.num_attention_heads % t == 0 and (kv % t == 0 or t % kv == 0):
            tps.append(t)
        t *= 2
    return tps


class _Search:
    def __init__(self, req: PlanRequest) -> None:
        self.req = req
        self.max_model_len = req.resolved_max_model_len()
        self.decisions: list[Decision] = []
        self.warnings: list[str] = []
        self.gpu_label = req.gpu.name

    def note(self, step: str, option: str, kept: bool, reason: str) -> None:
        self.decisions.append(Decision(step, option, kept, reason))

    def evaluate(self, layout: Layout) -> Candidate:
        mem = memory_breakdown(
            self.req.model,
            self.req.gpu,
            layout,
            self.max_model_len,
            gpu_memory_utilization=self.req.gpu_memory_utilization,
        )
        fits = sequences_that_fit(self.req.model, layout, mem, self.req.request_tokens)
        return Candidate(layout=layout, memory=mem, kv_concurrent_requests=fits)

    def useful(self, c: Candidate) -> bool:
        return c.memory.fits and c.kv_concurrent_requests >= MIN_USEFUL_CONCURRENCY

    def why_not(self, c: Candidate) -> str:
        m = c.memory
        where = f"{c.layout.num_gpus} × {self.gpu_label}"
        if not m.weights_fit:
            room = m.usable_bytes - m.activation_bytes - m.framework_reserve_bytes
            return (
                f"{c.layout.weight_dtype} weights {_gib(m.weights_bytes)} per GPU > "
                f"{_gib(room)} left of {_gib(m.usable_bytes)} usable on {where} "
                f"(activations {_gib(m.activation_bytes)}, reserve "
                f"{_gib(m.framework_reserve_bytes)})"
            )
        if not m.fits:
            return (
                f"weights {_gib(m.weights_bytes)} leave {_gib(m.kv_cache_bytes)} KV per GPU: "
                f"not one {self.max_model_len}-token sequence "
                f"({_gib(m.kv_bytes_per_sequence)} each)"
            )
        return (
            f"weights {_gib(m.weights_bytes)} leave {_gib(m.kv_cache_bytes)} "
            f"{c.layout.kv_dtype} KV per GPU = {c.kv_concurrent_requests} requests of "
            f"{self.req.request_tokens} tokens (want ≥ {MIN_USEFUL_CONCURRENCY})"
        )

    def why_yes(self, c: Candidate) -> str:
        m = c.memory
        return (
            f"weights {_gib(m.weights_bytes)} + activations {_gib(m.activation_bytes)} + "
            f"reserve {_gib(m.framework_reserve_bytes)} leave {_gib(m.kv_cache_bytes)} "
            f"{c.layout.kv_dtype} KV per GPU = {_tokens(m.kv_capacity_tokens)} tokens, "
            f"{c.kv_concurrent_requests} requests of {self.req.request_tokens} tokens, "
            f"{m.max_concurrent_seqs} of {self.max_model_len}"
        )

    def first_useful(
        self, tp: int, pp: int, weight_dtype: str
    ) -> tuple[Candidate | None, list[Candidate]]:
        """Try the KV ladder at one (tp, pp, weights); the first useful candidate wins."""
        tried: list[Candidate] = []
        for kv in _kv_ladder(self.req):
            c = self.evaluate(Layout(tp=tp, pp=pp, weight_dtype=weight_dtype, kv_dtype=kv))
            tried.append(c)
            if self.useful(c):
                return c, tried
            if not c.memory.weights_fit:
                break  # a smaller KV dtype cannot help weights that do not fit
        return None, tried

    # -- step 1 --------------------------------------------------------------------------
    def choose_precision(self) -> tuple[str, Candidate | None]:
        ladder = _weight_ladder(self.req)
        for w in ladder:
            found, tried = self.first_useful(1, 1, w)
            for c in tried:
                if c is not found:
                    self.note("precision", f"{c.layout.label} on 1 GPU", False, self.why_not(c))
            if found is not None:
                source = (
                    "--quant"
                    if self.req.quant != "auto"
                    else ("the checkpoint's precision" if w == ladder[0] else "quantized first")
                )
                self.note("precision", found.layout.label, True, f"{source}: {self.why_yes(found)}")
                return w, found
        w = ladder[-1]
        why = (
            "set by --quant"
            if self.req.quant != "auto"
            else (f"{w} is the smallest near-lossless precision")
        )
        hint = ""
        if self.req.quant == "auto" and "int4" not in ladder:
            int4, _ = self.first_useful(1, 1, "int4")
            if int4 is not None:
                hint = (
                    f"; int4 would fit 1 GPU ({_gib(int4.memory.weights_bytes)} weights) — "
                    "pass --quant int4 if its accuracy loss is acceptable"
                )
        self.note("precision", w, True, f"{why}; one GPU is not enough, split next{hint}")
        return w, None

    def quantize_for_slo(self, tp1: Candidate) -> Candidate:
        """Quantize first for speed too: when the precision that fits one GPU misses the
        SLOs there, try the next auto precision on one GPU before splitting."""
        if self.req.quant != "auto":
            return tp1
        slow = self.with_performance(tp1)
        if slow.performance is None or slow.performance.slo_met:
            return tp1
        ladder = _weight_ladder(self.req)
        for w in ladder[ladder.index(tp1.layout.weight_dtype) + 1 :]:
            found, _ = self.first_useful(1, 1, w)
            if found is None:
                continue
            fast = self.with_performance(found)
            if fast.performance is not None and fast.performance.slo_met:
                self.decisions = [
                    Decision(d.step, d.option, False, d.reason)
                    if d.step == "precision" and d.option == tp1.layout.label
                    else d
                    for d in self.decisions
                ]
                self.note(
                    "precision",
                    found.layout.label,
                    True,
                    f"{tp1.layout.weight_dtype} on 1 GPU {self.perf_summary(slow)}; "
                    f"{w} meets them on 1 GPU, so quantize before splitting",
                )
                return found
        return tp1

    # -- steps 2 and 3 -------------------------------------------------------------------
    def smallest_fit(
        self, weight_dtype: str, tp1: Candidate | None, max_gpus: int | None
    ) -> Candidate | None:
        if tp1 is not None:
            return tp1
        node = self.req.node_gpus
        tps = _valid_tps(self.req.model, node)
        for tp in tps[1:]:
            if max_gpus is not None and tp > max_gpus:
                return None
            found, tried = self.first_useful(tp, 1, weight_dtype)
            for c in tried:
                if c is not found:
                    self.note("tp", c.layout.label, False, self.why_not(c))
            if found is not None:
                self.note(
                    "tp",
                    found.layout.label,
                    True,
                    f"smallest TP in a node that fits: {self.why_yes(found)}",
                )
                return found
        tp = tps[-1]
        for pp in range(2, MAX_NODES + 1):
            if pp > self.req.model.num_layers:
                break
            if max_gpus is not None and tp * pp > max_gpus:
                return None
            found, tried = self.first_useful(tp, pp, weight_dtype)
            for c in tried:
                if c is not found:
                    self.note("pp", c.layout.label, False, self.why_not(c))
            if found is not None:
                self.note(
                    "pp",
                    found.layout.label,
                    True,
                    f"a node of TP={tp} is not enough; PP={pp} across {pp} nodes: "
                    f"{self.why_yes(found)}",
                )
                return found
        return None

    # -- step 4 --------------------------------------------------------------------------
    def with_performance(self, c: Candidate) -> Candidate:
        perf = _serving(self.req, c.layout, c.kv_concurrent_requests)
        if not perf.slo_met:
            return Candidate(c.layout, c.memory, c.kv_concurrent_requests, perf)
        replicas = max(1, math.ceil(self.req.rps / perf.max_requests_per_s))
        total = replicas * c.layout.num_gpus
        per_hour = total * self.req.price_per_gpu_hour_usd
        tokens_per_hour = self.req.rps * self.req.output_tokens * 3600
        per_million = per_hour / tokens_per_hour * 1e6 if tokens_per_hour > 0 else 0.0
        return Candidate(
            c.layout,
            c.memory,
            c.kv_concurrent_requests,
            perf,
            replicas,
            total,
            per_hour,
            per_million,
        )

    def perf_summary(self, c: Candidate) -> str:
        p = c.performance
        assert p is not None
        if not p.slo_met:
            return (
                f"misses the SLOs even with one request: TTFT {p.ttft_s:.2f} s "
                f"(SLO {self.req.ttft_slo_s} s), TPOT {p.tpot_s * 1e3:.1f} ms "
                f"(SLO {self.req.tpot_slo_s * 1e3:g} ms)"
            )
        return (
            f"{p.max_output_tokens_per_s:.0f} output tok/s per replica within the SLOs "
            f"({c.output_tokens_per_s_per_gpu:.0f} per GPU, {p.max_concurrency} in flight); "
            f"all-reduce {p.allreduce_share_of_decode:.0%} of the decode step"
        )

    def choose_by_performance(self, fitting: Candidate) -> tuple[Candidate, list[Candidate]]:
        """The smallest fitting layout, unless it misses the SLOs or a larger TP in the node
        serves --rps on fewer GPUs in total."""
        req = self.req
        evaluated = [self.with_performance(fitting)]
        if fitting.layout.pp == 1:
            for tp in _valid_tps(req.model, req.node_gpus):
                if tp <= fitting.layout.tp or (req.max_gpus is not None and tp > req.max_gpus):
                    continue
                found, _ = self.first_useful(tp, 1, fitting.layout.weight_dtype)
                if found is not None:
                    evaluated.append(self.with_performance(found))
        meeting = [c for c in evaluated if c.performance and c.performance.slo_met]
        # Fewest GPUs for --rps; on a tie the smaller TP (every split adds communication).
        chosen = min(meeting, key=lambda c: (c.total_gpus or 0, c.layout.tp), default=evaluated[0])
        for c in evaluated:
            if c is chosen:
                continue
            if not (c.performance and c.performance.slo_met):
                self.note("performance", c.layout.label, False, self.perf_summary(c))
                continue
            verdict = "over-provisioned" if c.layout.tp > chosen.layout.tp else "too small"
            self.note(
                "performance",
                c.layout.label,
                False,
                f"TP={c.layout.tp} {verdict}: --rps {req.rps:g} needs {c.total_gpus} GPUs "
                f"({c.replicas} × {c.layout.num_gpus}) vs {chosen.total_gpus} at "
                f"TP={chosen.layout.tp}; {self.perf_summary(c)}",
            )
        assert chosen.performance is not None
        self.note(
            "performance",
            chosen.layout.label,
            chosen.performance.slo_met,
            self.perf_summary(chosen),
        )
        return chosen, evaluated

    # -- step 5 --------------------------------------------------------------------------
    def choose_ep(self, chosen: Candidate) -> tuple[Candidate, Candidate | None]:
        model = self.req.model
        if model.moe is None:
            return chosen, None
        layout = chosen.layout
        if layout.tp == 1:
            self.note(
                "ep",
                "EP=1",
                True,
                f"one GPU per stage holds all {model.moe.num_experts} experts; nothing to split",
            )
            return chosen, None
        ep_layout = Layout(layout.tp, layout.pp, layout.tp, layout.weight_dtype, layout.kv_dtype)
        ep = self.evaluate(ep_layout)
        if not self.useful(ep):
            self.note("ep", ep_layout.label, False, self.why_not(ep))
            return chosen, ep
        ep = self.with_performance(ep)
        ep_rate, tp_rate = ep.output_tokens_per_s_per_gpu, chosen.output_tokens_per_s_per_gpu
        experts_per_rank = model.moe.num_experts // layout.tp
        if ep_rate > tp_rate:
            self.note(
                "ep",
                ep_layout.label,
                True,
                f"{experts_per_rank} whole experts per GPU instead of 1/{layout.tp} of each: "
                f"{ep_rate:.0f} vs {tp_rate:.0f} output tok/s per GPU within the SLOs",
            )
            return ep, chosen
        self.note(
            "ep",
            ep_layout.label,
            False,
            f"EP's all-to-all costs more than it saves: {ep_rate:.0f} vs {tp_rate:.0f} "
            "output tok/s per GPU within the SLOs with experts TP-sharded",
        )
        return chosen, ep

    # -- step 6 --------------------------------------------------------------------------
    def note_replicas(self, chosen: Candidate) -> None:
        p = chosen.performance
        if p is None or not p.slo_met or chosen.replicas is None:
            detail = f": {self.perf_summary(chosen)}" if p is not None else ""
            self.warnings.append(
                f"no layout in a node meets the SLOs; showing the smallest fitting one, "
                f"{chosen.layout.label}{detail}. Relax --ttft-slo / --tpot-slo, shorten "
                "--input-tokens, or pick a faster --gpu"
            )
            return
        self.note(
            "replicas",
            f"{chosen.replicas} × {chosen.layout.label}",
            True,
            f"--rps {self.req.rps:g} / {p.max_requests_per_s:.2f} req/s per replica within the "
            f"SLOs = {_plural(chosen.replicas, 'replica')}, {chosen.total_gpus} × {self.gpu_label}, "
            f"${chosen.cost_per_hour_usd:.2f}/h",
        )


def plan(req: PlanRequest) -> Plan:
    """Search layouts for `req` and explain every choice. Raises UserError when nothing
    fits the limits, naming what the smallest fitting layout would need."""
    _validate(req)
    search = _Search(req)
    weight_dtype, tp1 = search.choose_precision()
    if tp1 is not None:
        tp1 = search.quantize_for_slo(tp1)
        weight_dtype = tp1.layout.weight_dtype
    fitting = search.smallest_fit(weight_dtype, tp1, req.max_gpus)
    if fitting is None:
        raise _nothing_fits(req, search, weight_dtype, tp1)
    chosen, evaluated = search.choose_by_performance(fitting)
    chosen, alternative = search.choose_ep(chosen)
    if alternative is not None and alternative.performance is not None:
        evaluated.append(alternative)
    if chosen not in evaluated:
        evaluated.append(chosen)
    search.note_replicas(chosen)
    if (
        req.max_gpus is not None
        and chosen.total_gpus is not None
        and chosen.total_gpus > req.max_gpus
        and chosen.performance is not None
    ):
        per_replica = chosen.performance.max_requests_per_s
        allowed = req.max_gpus // chosen.layout.num_gpus
        raise UserError(
            f"--rps {req.rps:g} needs {chosen.replicas} replicas of {chosen.layout.label} = "
            f"{chosen.total_gpus} × {req.gpu.name}; --max-gpus {req.max_gpus} allows "
            f"{allowed} replicas = {allowed * per_replica:.1f} req/s within the SLOs",
            field="--max-gpus",
            fix=f"raise --max-gpus to {chosen.total_gpus} or lower --rps to "
            f"{allowed * per_replica:.1f}",
        )
    evaluated.sort(key=lambda c: (c.layout.num_gpus, c.layout.ep))
    return Plan(
        request=req,
        chosen=chosen,
        candidates=tuple(evaluated),
        decisions=tuple(search.decisions),
        max_model_len=search.max_model_len,
        launch=render_launch_commands(
            req.model,
            req.gpu,
            chosen.layout,
            max_model_len=search.max_model_len,
            gpu_memory_utilization=req.gpu_memory_utilization,
            gpus_per_node=req.node_gpus,
        ),
        warnings=tuple(search.warnings),
    )


def _validate(req: PlanRequest) -> None:
    def bad(field_name: str, message: str, fix: str) -> UserError:
        return UserError(message, field=field_name, fix=fix)

    if req.input_tokens < 1:
        raise bad("--input-tokens", "must be >= 1", "pass a prompt length in tokens")
    if req.output_tokens < 1:
        raise bad("--output-tokens", "must be >= 1", "pass an output length in tokens")
    if req.rps <= 0:
        raise bad("--rps", "must be > 0", "pass the requests per second to serve")
    if req.ttft_slo_s <= 0 or req.tpot_slo_s <= 0:
        raise bad(
            "--ttft-slo/--tpot-slo",
            "SLOs must be > 0 seconds",
            "e.g. --ttft-slo 1.0 --tpot-slo 0.05",
        )
    if req.node_gpus < 1:
        raise bad("--gpus-per-node", "must be >= 1", "e.g. --gpus-per-node 8")
    if req.max_gpus is not None and req.max_gpus < 1:
        raise bad("--max-gpus", "must be >= 1", "omit it for no limit")
    mml = req.resolved_max_model_len()
    if mml < req.request_tokens:
        raise bad(
            "--max-model-len",
            f"{mml} < input + output tokens ({req.request_tokens})",
            f"pass --max-model-len {req.request_tokens} or more",
        )
    if mml > req.model.max_position_embeddings:
        raise bad(
            "--max-model-len",
            f"{mml} > the model's max_position_embeddings ({req.model.max_position_embeddings})",
            f"pass --max-model-len {req.model.max_position_embeddings} or less",
        )


def _nothing_fits(
    req: PlanRequest, search: _Search, weight_dtype: str, tp1: Candidate | None
) -> UserError:
    """Name the smallest layout that would fit without --max-gpus."""
    unlimited = _Search(req)
    fit = unlimited.smallest_fit(weight_dtype, tp1, None)
    short = req.model.name.rsplit("/", 1)[-1]
    if fit is None:
        return UserError(
            f"{short} at {weight_dtype} does not fit even {MAX_NODES} nodes of "
            f"{req.node_gpus} × {req.gpu.name} with a useful KV cache",
            field="--gpu",
            fix="use a GPU with more memory, a lower precision (--quant) or a shorter --max-model-len",
        )
    layout = fit.layout
    if layout.pp > 1:
        need = (
            f"{layout.pp} nodes of {layout.tp} × {req.gpu.name} with PP={layout.pp} "
            f"({layout.num_gpus} GPUs)"
        )
    else:
        need = f"TP={layout.tp} ({layout.num_gpus} × {req.gpu.name})"
    fix = f"raise --max-gpus to {layout.num_gpus}"
    for lower in ("fp8", "int4"):
        if lower == weight_dtype or (weight_dtype in ("fp8", "fp4") and lower == "fp8"):
            continue
        alt_search = _Search(req)
        alt, _ = alt_search.first_useful(1, 1, lower)
        alt = alt or alt_search.smallest_fit(lower, None, req.max_gpus)
        if alt is not None:
            fix += f", or --quant {lower} fits {alt.layout.label} on {_plural(alt.layout.num_gpus, 'GPU')}"
            break
    return UserError(
        f"{short} {weight_dtype} needs {need}; --max-gpus {req.max_gpus} allows none",
        field="--max-gpus",
        fix=fix,
    )
