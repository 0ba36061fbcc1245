"""`gpufleet plan`: does the model fit, how to split it, how many replicas."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import click

from gpufleet.cli.jsonout import JsonOut, json_option
from gpufleet.specs.dtypes import KV_DTYPES, WEIGHT_DTYPES

if TYPE_CHECKING:
    from rich.console import Console

    from gpufleet.plan.search import Plan

QUANT_CHOICES = ("auto", *WEIGHT_DTYPES)
ENGINE_CHOICES = ("vllm", "sglang", "trtllm")
KV_CHOICES = ("auto", *KV_DTYPES)


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, refusing nan and inf: `nan > 0` is false, so FloatRange lets
    nan through its bounds, and an infinite --rps reached int() deep in the search."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value} is not a finite number", param, ctx)
        return rv


@click.command(name="plan")
@click.option(
    "--model",
    default=None,
    help="Catalog name (e.g. meta-llama/Llama-3.1-70B), a config.json, or a directory holding "
    "one. Required unless --groups.",
)
@click.option(
    "--groups",
    "groups_yaml",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Plan every model group of a fleet YAML (groups:, docs/multi-model.md) against "
    "--max-gpus together; exits 1 when they do not fit.",
)
@click.option(
    "--gpu",
    default=None,
    help="GPU kind: l4, a10g, l40s, a100-40gb, a100-80gb, h100-pcie, h100-sxm, h200, b200, b300, "
    "gb200, gb300 (NVL72), mi300x.",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs in one node (default: the GPU's usual 8).",
)
@click.option(
    "--input-tokens",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Prompt length per request.",
)
@click.option(
    "--output-tokens",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Output length per request.",
)
@click.option(
    "--rps",
    type=FiniteFloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Requests per second to serve.",
)
@click.option(
    "--ttft-slo",
    type=FiniteFloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Mean time-to-first-token SLO, seconds.",
)
@click.option(
    "--tpot-slo",
    type=FiniteFloatRange(min=0, min_open=True),
    default=0.05,
    show_default=True,
    help="Mean time-per-output-token SLO, seconds.",
)
@click.option(
    "--quant",
    type=click.Choice(QUANT_CHOICES),
    default="auto",
    show_default=True,
    help="Weight precision; auto keeps the checkpoint's (fp8, mxfp4, nvfp4 from its "
    "quantization_config) and quantizes to fp8 only when needed. nvfp4 / mxfp4 run W4A4 on "
    "Blackwell, weight-only (W4A16) elsewhere.",
)
@click.option(
    "--kv-dtype",
    type=click.Choice(KV_CHOICES),
    default="auto",
    show_default=True,
    help="KV cache precision; auto uses bf16 and fp8 when that is what fits.",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=1),
    default=None,
    help="Longest sequence the engine admits (default: max(8192, input+output), capped by the model).",
)
@click.option(
    "--max-gpus",
    type=click.IntRange(min=1),
    default=None,
    help="Upper bound on GPUs for the whole fleet.",
)
@click.option(
    "--gpu-price",
    type=FiniteFloatRange(min=0),
    default=None,
    help="$ per GPU-hour (default: the catalog's on-demand price).",
)
@click.option(
    "--emit",
    nargs=2,
    type=(click.Choice(["k8s"]), click.Path(file_okay=False)),
    default=None,
    metavar="k8s DIR",
    help="Also write Kubernetes manifests for the plan to DIR (as `gpufleet deploy k8s`).",
)
@click.option(
    "--namespace", default=None, help="With --emit k8s: the namespace [default: gpufleet]."
)
@click.option(
    "--engine",
    type=click.Choice(ENGINE_CHOICES),
    default="vllm",
    show_default=True,
    help="Whose memory accounting, admission, token budget and overheads the plan uses.",
)
@click.option(
    "--gpu-memory-utilization",
    type=FiniteFloatRange(min=0, max=1, min_open=True),
    default=None,
    help="The engine's memory fraction (vLLM --gpu-memory-utilization, SGLang "
    "--mem-fraction-static, TRT-LLM --kv_cache_free_gpu_memory_fraction); default: the "
    "engine's own (vLLM 0.9).",
)
@click.option(
    "--disagg",
    type=click.Choice(("auto", "off")),
    default="auto",
    show_default=True,
    help="auto: also plan disaggregated prefill / decode pools and say which wins.",
)
@json_option("the whole plan")
def command(
    model: str | None,
    groups_yaml: str | None,
    gpu: str | None,
    gpus_per_node: int | None,
    input_tokens: int,
    output_tokens: int,
    rps: float,
    ttft_slo: float,
    tpot_slo: float,
    quant: str,
    kv_dtype: str,
    max_model_len: int | None,
    max_gpus: int | None,
    gpu_price: float | None,
    emit: tuple[str, str] | None,
    namespace: str | None,
    engine: str,
    gpu_memory_utilization: float | None,
    disagg: str,
    json_path: str | None,
) -> None:
    """Memory per GPU, the layout decision trail, predicted TTFT/TPOT/throughput/cost,
    and launch commands for vLLM, SGLang and TRT-LLM (and for disaggregated prefill /
    decode pools when they are planned)."""
    if groups_yaml is not None:
        from gpufleet.cli.plan_groups import plan_groups_command

        plan_groups_command(groups_yaml, max_gpus, json_path)
        return
    for name, value in (("--model", model), ("--gpu", gpu)):
        if value is None:
            raise click.UsageError(f"Missing option '{name}' (or plan a fleet with --groups).")
    assert model is not None and gpu is not None
    from gpufleet.plan.search import PlanRequest, plan
    from gpufleet.specs import load_gpu, load_model

    req = PlanRequest(
        model=load_model(model),
        gpu=load_gpu(gpu),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        rps=rps,
        ttft_slo_s=ttft_slo,
        tpot_slo_s=tpot_slo,
        gpus_per_node=gpus_per_node,
        quant=quant,
        kv_dtype=kv_dtype,
        max_model_len=max_model_len,
        max_gpus=max_gpus,
        gpu_price_per_hour_usd=gpu_price,
        engine=engine,
        gpu_memory_utilization=gpu_memory_utilization,
        disaggregation=disagg,
    )
    result = plan(req)
    emitted, out_dir = None, emit[1] if emit is not None else ""
    if emit is not None:
        from gpufleet.k8s.emit import emit_plan

        emitted = emit_plan(result, out_dir, namespace=namespace)
    data = result.to_dict()
    if emitted is not None:
        data["emitted"] = {"files": [str(p) for p in emitted.paths], "summary": emitted.summary}
    with JsonOut(json_path) as out:
        if out.to_stdout:
            out.write(data)
            return
        print_plan(result, width=None if sys.stdout.isatty() else 140)
        if emitted is not None:
            from gpufleet.cli.deploy import print_emitted

            print_emitted(emitted, out_dir, as_json=False)
        written = out.write(data)
        if written:
            click.echo(f"wrote {written}")


def _gib(x: float) -> str:
    return f"{x / (1 << 30):.1f}"


def _ms(x: float) -> str:
    return f"{x * 1e3:.0f}" if x >= 0.01 else f"{x * 1e3:.1f}"


def print_plan(result: Plan, width: int | None = None) -> None:
    """The plan as rich tables: memory, decisions, performance, launch commands."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width, highlight=False)
    req = result.request
    model = req.model
    params = f"{model.total_params() / 1e9:.1f}B params"
    if model.is_moe:
        params += f", {model.active_params() / 1e9:.1f}B active"
    console.print(
        f"[bold]{model.name}[/] ({params}) on [bold]{req.gpu.name}[/] "
        f"({req.gpu.memory_bytes / (1 << 30):.0f} GiB, {req.node_gpus} per node)\n"
        f"{req.input_tokens} in / {req.output_tokens} out tokens, {req.rps:g} req/s, "
        f"SLO TTFT {req.ttft_slo_s:g} s, TPOT {req.tpot_slo_s * 1e3:g} ms, "
        f"max_model_len {result.max_model_len}"
    )

    chosen_mem = result.chosen.memory
    engine = chosen_mem.engine
    mem = Table(
        title=f"Memory per GPU (GiB; {engine} accounting at memory fraction "
        f"{chosen_mem.gpu_memory_utilization:g})"
    )
    logged = engine == "vllm"
    cols = ["layout", "GPUs", "usable", "weights", "activations", "reserve", "KV cache",
            "KV tokens"] + (["vLLM logs"] if logged else []) + [f"seqs @ {result.max_model_len}"]  # fmt: skip
    for col in cols:
        mem.add_column(col, justify="left" if col == "layout" else "right")
    for c in result.candidates:
        m = c.memory
        row = [
            ("* " if c is result.chosen else "") + c.layout.label,
            str(c.layout.num_gpus),
            _gib(m.usable_bytes),
            _gib(m.weights_bytes),
            _gib(m.activation_bytes),
            _gib(m.framework_reserve_bytes),
            _gib(m.kv_cache_bytes),
            f"{m.kv_capacity_tokens:,}",
        ]
        if logged:
            row.append(f"{m.kv_tokens_logged:,}")
        mem.add_row(*row, str(m.max_concurrent_seqs))
    console.print(mem)
    if logged and chosen_mem.kv_tokens_logged != chosen_mem.kv_capacity_tokens:
        console.print(
            "KV tokens: what the cache holds per sequence of max_model_len (sliding-window "
            'layers keep only their window); vLLM logs: its "GPU KV cache size: N tokens" '
            "line (vLLM >= 0.21: its maximum concurrency × max_model_len, beside "
            f'"Maximum concurrency for {result.max_model_len:,} tokens per request: '
            f'{chosen_mem.kv_concurrency_logged:.2f}x")'
        )

    trail = Table.grid(padding=(0, 1))
    trail.add_column(no_wrap=True)
    trail.add_column(no_wrap=True)
    trail.add_column(no_wrap=True)
    trail.add_column()
    for d in result.decisions:
        mark = "[green]✓[/]" if d.kept else "[red]✗[/]"
        trail.add_row(mark, d.step, d.option, d.reason)
    console.print("[bold]Decisions[/] (in the order they are made)")
    console.print(trail)

    perf = Table(
        title=f"Performance per layout ({engine}, at --rps; max = highest load within SLOs)"
    )
    for col in ("layout", "prefill ms", "TTFT ms", "TPOT ms", "in flight", "max tok/s",
                "max req/s", "replicas", "GPUs", "$/h", "$/M out tok"):  # fmt: skip
        perf.add_column(col, justify="left" if col == "layout" else "right")
    for c in result.candidates:
        p = c.performance
        if p is None:
            continue
        ok = p.slo_met and c.replicas is not None
        perf.add_row(
            ("* " if c is result.chosen else "") + c.layout.label,
            _ms(p.prefill_s),
            _ms(p.ttft_s),
            _ms(p.tpot_s),
            str(p.steady_concurrency) if ok else "-",
            f"{p.max_output_tokens_per_s:,.0f}" if ok else "misses SLO",
            f"{p.max_requests_per_s:.2f}" if ok else "-",
            str(c.replicas) if ok else "-",
            str(c.total_gpus) if ok else "-",
            f"{c.cost_per_hour_usd:.2f}" if c.cost_per_hour_usd is not None else "-",
            f"{c.cost_per_million_output_tokens_usd:.2f}"
            if c.cost_per_million_output_tokens_usd is not None
            else "-",
        )
    console.print(perf)

    chosen = result.chosen
    console.print(
        f"[bold]Plan:[/] {chosen.replicas or 1} × ({chosen.layout.label}) = "
        f"{chosen.total_gpus or chosen.layout.num_gpus} × {req.gpu.name}"
        + (
            f", ${chosen.cost_per_hour_usd:.2f}/h, "
            f"${chosen.cost_per_million_output_tokens_usd:.2f} per M output tokens"
            if chosen.cost_per_hour_usd is not None
            and chosen.cost_per_million_output_tokens_usd is not None
            else ""
        )
    )
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print("[bold]Launch (one replica):[/]")
    console.print(result.launch.vllm, soft_wrap=True)
    console.print(result.launch.sglang, soft_wrap=True)
    console.print(result.launch.trtllm, soft_wrap=True)
    for note in result.launch.notes:
        console.print(f"# {note}", soft_wrap=True)
    print_disaggregated(result, console)


def print_disaggregated(result: Plan, console: Console) -> None:
    """The disaggregated prefill / decode option, its verdict and its commands."""
    d, launch = result.disaggregated, result.disagg_launch
    if d is None or launch is None:
        return
    verdict = "[green]recommended[/]" if d.wins else "not recommended"
    console.print(
        f"[bold]Disaggregated prefill / decode[/] ({verdict}): "
        f"{d.prefill.replicas} × {d.prefill.layout.label} prefill + "
        f"{d.decode.replicas} × {d.decode.layout.label} decode = {d.total_gpus} GPUs, "
        f"TTFT {_ms(d.ttft_s)} ms, TPOT {_ms(d.tpot_s)} ms, KV transfer "
        f"{_ms(d.kv_transfer_s)} ms per prompt at {d.kv_link_gbps:g} GB/s per GPU"
    )
    console.print(f"# {d.reason}", soft_wrap=True)
    for cmd in (launch.vllm_prefill, launch.vllm_decode, launch.vllm_router,
                launch.sglang_prefill, launch.sglang_decode, launch.sglang_router):  # fmt: skip
        console.print(cmd, soft_wrap=True)
    for note in launch.notes:
        console.print(f"# {note}", soft_wrap=True)
