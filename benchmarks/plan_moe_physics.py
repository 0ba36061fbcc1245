"""The MoE layer's cost against kernel measurements and the rows' prompt-length slopes
(issue 14, wave 16).

    GPUFLEET_SHARED=/work/shared python benchmarks/plan_moe_physics.py [CSV] [--out PATH]

1. Grouped GEMMs on an H200 (`h200_moe.csv`, PyTorch `torch._grouped_mm`, whole bf16
   experts): measured time against the roofline's MoE term with the prior's constants
   (expert reads at moe_efficiency x memory_efficiency of HBM, FLOPs at moe_gemm_efficiency
   x gemm_efficiency of peak, the larger of the two), by tokens per expert; beside it the
   same term at each engine's fitted `moe_gemm_efficiency`.
2. TTFT's prompt-length slope: for each campaign cell (engine, model, GPU, layout, output
   length, clients) measured at two or more prompt lengths, (TTFT at the longest - at the
   shortest), predicted over measured. A per-request constant cancels in it, so it says how
   much a prompt token costs, which is what `moe_gemm_efficiency` sets in a prefill. Shipped
   constants; the same with every engine's `moe_gemm_efficiency` at its prior; and with the
   activation traffic of `perf.moe_traffic` on.
3. One prefill step of 128 / 1024 / 8192 tokens and one decode step of 16 (ms) per MoE
   layout of the rows, in the same three variants: every term is non-decreasing in the
   step's tokens.

Writes benchmarks/results/plan_moe_physics.{json,md}.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpufleet.perf import moe_traffic
from gpufleet.perf.calibration import Calibration, default_calibration, prior_calibration
from gpufleet.perf.step_time import StepBatch
from gpufleet.plan.engines import engine_rules
from gpufleet.plan.perf_serving import layout_step_model
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu
from gpufleet.validation.measured import (
    MeasuredRow,
    default_csv,
    predict_row,
    read_rows,
    resolve_model,
    row_layout,
    row_scheme,
)
from gpufleet.validation.recipes import batch_wait_rules

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write_result

KERNEL_MODELS = {  # h200_moe.csv's names: the checkpoints whose expert shapes it ran
    "deepseek_v3_ep8": "deepseek-ai/DeepSeek-V3",
    "qwen3_235b_ep8": "Qwen/Qwen3-235B-A22B",
    "gpt_oss_120b_ep4": "openai/gpt-oss-120b",
    "mixtral_8x7b_tp1": "mistralai/Mixtral-8x7B-v0.1",
}
VARIANTS = ("shipped", "moe_gemm_efficiency at prior", "and activation traffic")


def kernel_rows(path: Path, cal: Calibration, engines: Sequence[str]) -> list[dict[str, Any]]:
    """h200_moe.csv's grouped-GEMM rows beside the roofline's MoE term."""
    gpu = load_gpu("h200")
    prior = prior_calibration()
    hbm = gpu.hbm_gbps * 1e9 * prior.memory_efficiency
    peak = gpu.tflops("bf16") * 1e12 * prior.gemm_efficiency
    out = []
    with path.open() as f:
        for r in csv.DictReader(f):
            if r["method"] != "grouped_mm":
                continue
            model = load_model(KERNEL_MODELS[r["model"]])
            experts, pairs = int(r["E"]), int(r["assignments"])
            params = model.expert_params()
            read = experts * params * 2.0 + pairs * 2 * model.hidden_size * 2.0
            flops = 2.0 * pairs * params

            def term_s(moe_eff: float, gemm_eff: float) -> float:
                return max(read / (hbm * moe_eff), flops / (peak * gemm_eff))  # noqa: B023

            b = prior.backend(None)
            measured = float(r["seconds"])
            row = {"model": r["model"], "tokens_per_expert": pairs / experts,
                   "measured_us": measured * 1e6,
                   "prior_us": term_s(b.moe_efficiency, b.moe_gemm_efficiency) * 1e6}  # fmt: skip
            for e in engines:
                fitted = cal.backend(e)
                row[f"{e}_us"] = term_s(fitted.moe_efficiency, fitted.moe_gemm_efficiency) * 1e6
            out.append(row)
    return out


def _with_gemm_at_prior(cal: Calibration) -> Calibration:
    prior = prior_calibration().backend(None).moe_gemm_efficiency
    backends = {
        k: dataclasses.replace(b, moe_gemm_efficiency=prior) for k, b in cal.backends.items()
    }
    return dataclasses.replace(cal, backends=MappingProxyType(backends))


def _variants(cal: Calibration) -> list[tuple[str, Calibration, bool]]:
    at_prior = _with_gemm_at_prior(cal)
    return [
        (VARIANTS[0], cal, False),
        (VARIANTS[1], at_prior, False),
        (VARIANTS[2], at_prior, True),
    ]


def _each_variant(cal: Calibration, fn: Callable[[Calibration], Any]) -> list[Any]:
    out = []
    for _, c, traffic in _variants(cal):
        moe_traffic.MOE_ACTIVATION_TRAFFIC = traffic
        try:
            out.append(fn(c))
        finally:
            moe_traffic.MOE_ACTIVATION_TRAFFIC = False
    return out


def slope_rows(rows: Sequence[MeasuredRow], cal: Calibration) -> list[dict[str, Any]]:
    """Per engine x model x dense / MoE: the median over cells of predicted / measured TTFT
    rise from the shortest to the longest prompt (cells whose TTFT rises by > 5 ms)."""
    cells: dict[tuple[Any, ...], dict[int, MeasuredRow]] = {}
    for r in rows:
        key = (r.backend, r.model_path, r.system, r.tp, r.moe_tp, r.moe_ep, r.attention_dp,
               r.osl, r.batch_size)  # fmt: skip
        cells.setdefault(key, {}).setdefault(r.isl, r)
    pairs = [(c[min(c)], c[max(c)]) for c in cells.values() if len(c) > 1]
    preds = _each_variant(cal, lambda c: {r.id: predict_row(r, c) for p in pairs for r in p})
    groups: dict[tuple[str, str], list[tuple[float, ...]]] = {}
    flat: dict[tuple[str, str], int] = {}
    for lo, hi in pairs:
        moe = resolve_model(hi.model_path).moe is not None
        key = (hi.backend, f"{hi.model_path.rsplit('/', 1)[-1]} ({'MoE' if moe else 'dense'})")
        rise = hi.ttft_s - lo.ttft_s
        if rise <= 0.005:
            flat[key] = flat.get(key, 0) + 1
            continue
        groups.setdefault(key, []).append(
            tuple((p[hi.id].ttft_s - p[lo.id].ttft_s) / rise for p in preds)
        )
    return [{"engine": k[0], "model": k[1], "cells": len(v), "flat_or_falling": flat.get(k, 0),
             **{name: statistics.median(x[i] for x in v) for i, name in enumerate(VARIANTS)}}
            for k, v in sorted(groups.items())]  # fmt: skip


def _steps_ms(
    row: MeasuredRow,
    model: Any,
    gpu: Any,
    layout: Any,
    rules: Any,
    batches: Sequence[StepBatch],
    cal: Calibration,
) -> list[float]:
    step = layout_step_model(model, gpu, layout, backend=row.backend, calibration=cal,
                             scheme=row_scheme(row), rules=rules)  # fmt: skip
    return [step.step_time_s(b) * 1e3 for b in batches]


def step_rows(rows: Sequence[MeasuredRow], cal: Calibration) -> list[dict[str, Any]]:
    """One prefill step of 128 / 1024 / 8192 tokens and a decode step of 16, per layout."""
    out, seen = [], set()
    batches = [StepBatch((n,), (0,)) for n in (128, 1024, 8192)]
    batches.append(StepBatch(num_decode=16, decode_context_tokens=16 * 2000))
    for r in rows:
        model = resolve_model(r.model_path)
        key = (r.backend, model.name, r.system, r.tp, r.moe_tp, r.moe_ep, r.attention_dp)
        if model.moe is None or key in seen:
            continue
        seen.add(key)
        gpu = load_gpu(r.system)
        layout = row_layout(r, model, gpu).layout
        rules = batch_wait_rules(
            r, engine_rules(r.backend, gpu, tp=layout.tp, pp=layout.pp, dp=layout.dp)
        )

        steps_ms = functools.partial(_steps_ms, r, model, gpu, layout, rules, batches)
        out.append({"engine": r.backend, "model": model.name, "gpu": r.system,
                    "layout": f"tp {r.tp} moe_tp {r.moe_tp} ep {r.moe_ep} dp {r.attention_dp}",
                    **dict(zip(VARIANTS, _each_variant(cal, steps_ms), strict=True))})  # fmt: skip
    return out


def render(
    kernels: list[dict[str, Any]],
    slopes: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    engines: Sequence[str],
) -> str:
    errs = [k["prior_us"] / k["measured_us"] - 1 for k in kernels]
    lines = [
        "Grouped GEMMs on an H200 (h200_moe.csv) against the roofline's MoE term (µs)",
        "",
        "| kernel | tokens / expert | measured | prior | " + " | ".join(engines) + " |",
        "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in engines) + " |",
    ]
    for k in kernels:
        lines.append(f"| {k['model']} | {k['tokens_per_expert']:.0f} | {k['measured_us']:.0f} | "
                     f"{k['prior_us']:.0f} | " + " | ".join(f"{k[e + '_us']:.0f}" for e in engines) + " |")  # fmt: skip
    lines += ["", f"prior: median |error| {statistics.median(abs(e) for e in errs) * 100:.1f} %, "
              f"largest {max(abs(e) for e in errs) * 100:.1f} %", "",
              "TTFT rise from the shortest to the longest prompt, predicted / measured (median over cells)",
              "", "| engine | model | cells | flat or falling | " + " | ".join(VARIANTS) + " |",
              "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in VARIANTS) + " |"]  # fmt: skip
    for s in slopes:
        lines.append(f"| {s['engine']} | {s['model']} | {s['cells']} | {s['flat_or_falling']} | "
                     + " | ".join(f"{s[v]:.2f}" for v in VARIANTS) + " |")  # fmt: skip
    lines += ["", "One step (ms): prefill of 128 / 1024 / 8192 tokens, decode of 16", "",
              "| engine | model | GPU | layout | " + " | ".join(VARIANTS) + " |",
              "| --- | --- | --- | --- | " + " | ".join("---" for _ in VARIANTS) + " |"]  # fmt: skip
    for s in steps:
        cells = [" / ".join(f"{x:.0f}" for x in s[v]) for v in VARIANTS]
        lines.append(
            f"| {s['engine']} | {s['model']} | {s['gpu']} | {s['layout']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", type=Path, default=None)
    parser.add_argument("--out", default="plan_moe_physics")
    args = parser.parse_args(argv)
    path = args.csv or default_csv()
    rows = read_rows(path)
    cal = default_calibration()
    engines = ("sglang", "trtllm", "vllm")
    kernels = kernel_rows(path.parent / "h200_moe.csv", cal, engines)
    slopes = slope_rows(rows, cal)
    steps = step_rows(rows, cal)
    table = render(kernels, slopes, steps, engines)
    write_result(args.out, {"kernels": kernels, "slopes": slopes, "steps": steps}, table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
