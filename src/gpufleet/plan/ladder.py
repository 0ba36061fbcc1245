"""The decision ladder (DESIGN.md: "Decision order"), one method per step.

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

Every option tried becomes a `Decision` that says in numbers why it was kept or rejected
(the words are in `explain`). Pure: no clock, no I/O.
"""

from __future__ import annotations

import math

from gpufleet.plan import explain
from gpufleet.plan.engines import engine_rules
from gpufleet.plan.layout import Layout
from gpufleet.plan.layout_perf import layout_performance
from gpufleet.plan.memory import memory_breakdown, sequences_that_fit
from gpufleet.plan.types import (
    MAX_NODES,
    MIN_USEFUL_CONCURRENCY,
    Candidate,
    Decision,
    PlanRequest,
)
from gpufleet.specs.models import ModelSpec


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


class Ladder:
    def __init__(self, req: PlanRequest) -> None:
        self.req = req
        self.max_model_len = req.resolved_max_model_len()
        self.decisions: list[Decision] = []
        self.warnings: list[str] = []

    def note(self, step: str, option: str, kept: bool, reason: str) -> None:
        self.decisions.append(Decision(step, option, kept, reason))

    def evaluate(self, layout: Layout) -> Candidate:
        req = self.req
        mem = memory_breakdown(
            req.model,
            req.gpu,
            layout,
            self.max_model_len,
            gpu_memory_utilization=req.gpu_memory_utilization,
            engine=req.engine,
        )
        rules = engine_rules(req.engine, req.gpu, tp=layout.tp, pp=layout.pp, dp=layout.dp)
        footprint = rules.admission_tokens(req.input_tokens, req.output_tokens)
        fits = sequences_that_fit(req.model, layout, mem, footprint) * layout.dp
        return Candidate(layout=layout, memory=mem, kv_concurrent_requests=fits)

    def useful(self, c: Candidate) -> bool:
        return c.memory.fits and c.kv_concurrent_requests >= MIN_USEFUL_CONCURRENCY

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
                    self.note(
                        "precision",
                        f"{c.layout.label} on 1 GPU",
                        False,
                        explain.why_not(self.req, self.max_model_len, c),
                    )
            if found is not None:
                source = (
                    "--quant"
                    if self.req.quant != "auto"
                    else ("the checkpoint's precision" if w == ladder[0] else "quantized first")
                )
                self.note(
                    "precision",
                    found.layout.label,
                    True,
                    f"{source}: {explain.why_yes(self.req, self.max_model_len, found)}",
                )
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
                    f"; int4 would fit 1 GPU ({explain.gib(int4.memory.weights_bytes)} weights) — "
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
                    f"{tp1.layout.weight_dtype} on 1 GPU {explain.perf_summary(self.req, slow)}; "
                    f"{w} meets them on 1 GPU, so quantize before splitting",
                )
                return found
        return tp1

    # -- steps 2 and 3 -------------------------------------------------------------------
    def _reject(self, step: str, tried: list[Candidate], kept: Candidate | None) -> None:
        """Note why each layout tried at this step, other than the one kept, does not do."""
        for c in tried:
            if c is not kept:
                self.note(
                    step, c.layout.label, False, explain.why_not(self.req, self.max_model_len, c)
                )

    def smallest_fit(
        self, weight_dtype: str, tp1: Candidate | None, max_gpus: int | None
    ) -> Candidate | None:
        if tp1 is not None:
            return tp1
        node = self.req.tp_domain_gpus
        tps = _valid_tps(self.req.model, node)
        for tp in tps[1:]:
            if max_gpus is not None and tp > max_gpus:
                return None
            found, tried = self.first_useful(tp, 1, weight_dtype)
            self._reject("tp", tried, found)
            if found is not None:
                self.note(
                    "tp",
                    found.layout.label,
                    True,
                    f"smallest TP in a node that fits: {explain.why_yes(self.req, self.max_model_len, found)}",
                )
                return found
        tp = tps[-1]
        for pp in range(2, MAX_NODES + 1):
            if pp > self.req.model.num_layers:
                break
            if max_gpus is not None and tp * pp > max_gpus:
                return None
            found, tried = self.first_useful(tp, pp, weight_dtype)
            self._reject("pp", tried, found)
            if found is not None:
                self.note(
                    "pp",
                    found.layout.label,
                    True,
                    f"a node of TP={tp} is not enough; PP={pp} across {pp} nodes: "
                    f"{explain.why_yes(self.req, self.max_model_len, found)}",
                )
                return found
        return None

    # -- step 4 --------------------------------------------------------------------------
    def with_performance(self, c: Candidate) -> Candidate:
        perf = layout_performance(self.req, c.layout, c.memory)
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

    def choose_by_performance(self, fitting: Candidate) -> tuple[Candidate, list[Candidate]]:
        """The smallest fitting layout, unless it misses the SLOs or a larger TP in the node
        serves --rps on fewer GPUs in total."""
        req = self.req
        evaluated = [self.with_performance(fitting)]
        if fitting.layout.pp == 1:
            for tp in _valid_tps(req.model, req.tp_domain_gpus):
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
                self.note("performance", c.layout.label, False, explain.perf_summary(self.req, c))
                continue
            verdict = "over-provisioned" if c.layout.tp > chosen.layout.tp else "too small"
            self.note(
                "performance",
                c.layout.label,
                False,
                f"TP={c.layout.tp} {verdict}: --rps {req.rps:g} needs {c.total_gpus} GPUs "
                f"({c.replicas} × {c.layout.num_gpus}) vs {chosen.total_gpus} at "
                f"TP={chosen.layout.tp}; {explain.perf_summary(self.req, c)}",
            )
        assert chosen.performance is not None
        self.note(
            "performance",
            chosen.layout.label,
            chosen.performance.slo_met,
            explain.perf_summary(self.req, chosen),
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
        ep_layout = Layout(
            tp=layout.tp, pp=layout.pp, ep=layout.tp, weight_dtype=layout.weight_dtype,
            kv_dtype=layout.kv_dtype,
        )  # fmt: skip
        ep = self.evaluate(ep_layout)
        if not self.useful(ep):
            self.note(
                "ep", ep_layout.label, False, explain.why_not(self.req, self.max_model_len, ep)
            )
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
            detail = f": {explain.perf_summary(self.req, chosen)}" if p is not None else ""
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
            f"SLOs = {explain.plural(chosen.replicas, 'replica')}, {chosen.total_gpus} × {self.req.gpu.name}, "
            f"${chosen.cost_per_hour_usd:.2f}/h",
        )
