"""`gpufleet plan`: does the model fit, how to split it, how many replicas."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from gpufleet.specs.dtypes import KV_DTYPES

if TYPE_CHECKING:
    from gpufleet.plan.search import Plan

QUANT_CHOICES = ("auto", "bf16", "fp8", "int8", "int4")
KV_CHOICES = ("auto", *KV_DTYPES)


@click.command(name="plan")
@click.option(
    "--model",
    required=True,
    help="Catalog name (e.g. meta-llama/Llama-3.1-70B), a config.json, or a directory holding one.",
)
@click.option(
    "--gpu",
    required=True,
    help="GPU kind: l4, a10g, l40s, a100-40gb, a100-80gb, h100-pcie, h100-sxm, h200, b200, b300, mi300x.",
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
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Requests per second to serve.",
)
@click.option(
    "--ttft-slo",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Mean time-to-first-token SLO, seconds.",
)
@click.option(
    "--tpot-slo",
    type=click.FloatRange(min=0, min_open=True),
    default=0.05,
    show_default=True,
    help="Mean time-per-output-token SLO, seconds.",
)
@click.option(
    "--quant",
    type=click.Choice(QUANT_CHOICES),
    default="auto",
    show_default=True,
    help="Weight precision; auto keeps the checkpoint's and quantizes to fp8 only when needed.",
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
    type=click.FloatRange(min=0),
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
@click.option("--json", "as_json", is_flag=True, help="Print the whole plan as JSON.")
def command(
    model: str,
    gpu: str,
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
    as_json: bool,
) -> None:
    """Memory per GPU, the layout decision trail, predicted TTFT/TPOT/throughput/cost,
    and launch commands for vLLM and SGLang."""
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
    )
    result = plan(req)
    emitted, out_dir = None, emit[1] if emit is not None else ""
    if emit is not None:
        from gpufleet.k8s.emit import emit_plan

        emitted = emit_plan(result, out_dir, namespace=namespace)
    if as_json:
        data = result.to_dict()
        if emitted is not None:
            data["emitted"] = {"files": [str(p) for p in emitted.paths], "summary": emitted.summary}
        click.echo(json.dumps(data, indent=2))
        return
    print_plan(result, width=None if sys.stdout.isatty() else 140)
    if emitted is not None:
        from gpufleet.cli.deploy import print_emitted

        print_emitted(emitted, out_dir, as_json=False)


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

    mem = Table(title="Memory per GPU (GiB; vLLM accounting at gpu_memory_utilization 0.9)")
    for col in ("layout", "GPUs", "usable", "weights", "activations", "reserve", "KV cache",
                "KV tokens", f"seqs @ {result.max_model_len}"):  # fmt: skip
        mem.add_column(col, justify="left" if col == "layout" else "right")
    for c in result.candidates:
        m = c.memory
        mem.add_row(
            ("* " if c is result.chosen else "") + c.layout.label,
            str(c.layout.num_gpus),
            _gib(m.usable_bytes),
            _gib(m.weights_bytes),
            _gib(m.activation_bytes),
            _gib(m.framework_reserve_bytes),
            _gib(m.kv_cache_bytes),
            f"{m.kv_capacity_tokens:,}",
            str(m.max_concurrent_seqs),
        )
    console.print(mem)

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

    perf = Table(title="Performance per layout (vLLM, at --rps; max = highest load within SLOs)")
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
    for note in result.launch.notes:
        console.print(f"# {note}", soft_wrap=True)
