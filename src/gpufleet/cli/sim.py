"""`gpufleet sim`: replay a trace or synthetic load over a simulated fleet (virtual clock).

Same replica flags as `gpufleet replica`, same workload flags as `gpufleet bench`, the
routing policies of `gpufleet gateway --policy` and the autoscaling policies of
`gpufleet up`. `--sweep` runs several routing or autoscaling policies side by side.
"""

from __future__ import annotations

import json
from typing import Any

import click

from gpufleet.cli.jsonout import JsonOut, json_option
from gpufleet.errors import UserError

# --sweep KEY=V1,V2,...: which Scenario field each key sets, and how to read a value.
SWEEP_KEYS: dict[str, tuple[str, type]] = {
    "routing": ("routing", str),
    "policy": ("routing", str),
    "autoscale": ("autoscale", str),
    "replicas": ("replicas", int),
    "rate": ("rate", float),
    "speedup": ("speedup", float),
    "max-replicas": ("max_replicas", int),
    "min-replicas": ("min_replicas", int),
    "startup-s": ("startup_s", float),
    "concurrency": ("concurrency", int),
}


def _parse_kv(items: tuple[str, ...], flag: str) -> tuple[tuple[str, Any], ...]:
    out: list[tuple[str, Any]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(
                f"bad item {item!r}", field=flag, fix="KEY=VALUE, e.g. load=queue_depth"
            )
        value: Any
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw  # a bare string
        out.append((key.strip(), value))
    return tuple(out)


def _parse_sweep(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """'replicas=4,8' -> ('replicas', [('4', 4), ('8', 8)]): the field, and (label, value)s."""
    key, sep, values = text.partition("=")
    spec = SWEEP_KEYS.get(key.strip().replace("_", "-"))
    labels = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or spec is None or not labels:
        raise UserError(
            f"bad sweep {text!r}",
            field="--sweep",
            fix=f"KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}; "
            "e.g. routing=round_robin,prefix_aware or autoscale=hpa,kpa,default",
        )
    field, kind = spec
    try:
        return field, [(label, kind(label)) for label in labels]
    except ValueError:
        raise UserError(
            f"{key} takes {kind.__name__} values, got {values!r}", field="--sweep"
        ) from None


@click.command(name="sim")
# replica layout
@click.option("--model", default="meta-llama/Llama-3.1-8B", show_default=True)
@click.option("--gpu", default="h100-sxm", show_default=True)
@click.option("--tp", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--pp", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--ep", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--quant", default="bf16", show_default=True, help="Weight dtype: bf16, fp8, int4.")
@click.option("--kv-cache-dtype", default="auto", show_default=True)
@click.option("--max-model-len", default=None, type=click.IntRange(min=2))
@click.option("--max-num-seqs", default=256, show_default=True, type=click.IntRange(min=1))
@click.option("--max-num-batched-tokens", default=None, type=click.IntRange(min=1))
@click.option("--gpu-memory-utilization", default=0.9, show_default=True, type=float)
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=True)
# workload
@click.option(
    "--trace",
    default=None,
    help="Azure LLM CSV or Mooncake JSONL trace to replay (.gz too), or sample:mooncake / "
    "sample:azure (shipped with the package).",
)
@click.option("--trace-format", default="auto", type=click.Choice(["auto", "azure", "mooncake"]))
@click.option("--speedup", default=1.0, show_default=True, type=float, help="Trace pace ×.")
@click.option("--trace-start-s", default=0.0, show_default=True, type=float, help="Slice start.")
@click.option("--duration", default=None, type=float, help="Seconds of trace (or of --rate load).")
@click.option("--num-requests", default=None, type=click.IntRange(min=1))
@click.option("--rate", default=None, type=float, help="Open-loop requests/s (synthetic).")
@click.option(
    "--rate-steps", default=None, help="Stepped rate, RATE:SECONDS,..., e.g. 2:60,20:120."
)
@click.option("--concurrency", default=None, type=click.IntRange(min=1), help="Closed loop.")
@click.option("--burstiness", default=1.0, show_default=True, type=float, help="1 = Poisson.")
@click.option("--input-tokens", default=1024, show_default=True, type=click.IntRange(min=0))
@click.option("--output-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--range-ratio", default=0.0, show_default=True, type=float)
@click.option("--prefix-groups", default=None, type=click.IntRange(min=1))
@click.option("--prefix-tokens", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--sessions", default=None, type=click.IntRange(min=1), help="Multi-turn sessions.")
@click.option("--turns", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--lora-adapters", default=None, type=click.IntRange(min=1),
    help="Requests ask for one of N LoRA adapters (replicas run with --enable-lora).",
)  # fmt: skip
@click.option("--lora-zipf", default=1.0, show_default=True, type=float,
              help="Zipf exponent of adapter popularity (0 = uniform).")  # fmt: skip
@click.option("--max-loras", default=1, show_default=True, type=click.IntRange(min=1),
              help="Adapters one batch may use (vLLM's flag).")  # fmt: skip
@click.option("--max-lora-rank", default=16, show_default=True, type=click.IntRange(min=1))
# fleet
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=0))
@click.option("--policy", default="round_robin", show_default=True, help="Routing policy.")
@click.option("--policy-option", multiple=True, help="Routing option KEY=VALUE (repeatable).")
@click.option("--autoscale", default=None, help="Scaling policy: default, hpa, kpa, ...")
@click.option("--autoscale-param", multiple=True, help="Scaling parameter KEY=VALUE.")
@click.option("--min-replicas", default=1, show_default=True, type=click.IntRange(min=0))
@click.option("--max-replicas", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--startup-s", default=30.0, show_default=True, type=float, help="Cold start.")
@click.option("--autoscale-interval-s", default=1.0, show_default=True, type=float)
@click.option("--drain-deadline-s", default=60.0, show_default=True, type=float)
@click.option("--scrape-interval-s", default=1.0, show_default=True, type=float)
@click.option("--queue-timeout-s", default=60.0, show_default=True, type=float)
@click.option(
    "--queue-max-size", default=256, show_default=True, type=click.IntRange(min=0),
    help="Gateway queue bound: requests beyond it get the gateway's 503.",
)  # fmt: skip
@click.option("--tail-s", default=0.0, show_default=True, type=float, help="Idle time after.")
# output
@click.option(
    "--sweep", default=None, help="KEY=V1,V2,...: routing, autoscale, replicas, rate, speedup, ..."
)
@click.option("--workers", default=None, type=click.IntRange(min=1), help="Sweep processes.")
@click.option(
    "--ray-address",
    default=None,
    help="Run the sweep on a Ray cluster, one scenario per task: auto | ray://HOST:10001.",
)
@json_option()
@click.option(
    "--report",
    type=click.Path(file_okay=False),
    default=None,
    help="Write PNG plots and an HTML summary into this directory (needs the plot extra).",
)
def command(**kw: Any) -> None:
    """Simulate a fleet of replicas behind a router (and an autoscaler) on a virtual clock."""
    from gpufleet.sim.scenario import Scenario
    from gpufleet.workload import parse_rate_steps

    if kw["autoscale"] is None and kw["replicas"] < 1:
        raise UserError("must be >= 1", field="--replicas", fix="or pass --autoscale POLICY")
    synthetic = ("rate", "rate_steps", "concurrency", "sessions", "prefix_groups")
    if kw["trace"] is not None:
        for name in synthetic:
            if kw[name] is not None:
                flag = "--" + name.replace("_", "-")
                raise UserError(
                    "a trace brings its own arrivals and prompts",
                    field=flag,
                    fix=f"drop {flag}, or drop --trace; use --speedup to change a trace's pace",
                )
    if kw["rate"] is not None and kw["rate_steps"]:
        raise UserError("give one rate", field="--rate-steps", fix="drop --rate or --rate-steps")
    if kw["concurrency"] is not None and (kw["rate"] is not None or kw["rate_steps"]):
        raise UserError(
            "a closed loop sets its own pace", field="--concurrency", fix="drop --rate or it"
        )
    if kw["trace"] is None and kw["rate"] is None and not kw["rate_steps"]:
        if kw["concurrency"] is None:
            raise UserError(
                "no workload", field="--trace", fix="pass --trace FILE, --rate R or --concurrency N"
            )
        if kw["num_requests"] is None:
            raise UserError("a closed-loop run needs a count", field="--num-requests")
        if kw["sessions"] is not None:
            raise UserError(
                "sessions need an open-loop rate", field="--sessions", fix="add --rate R"
            )
    sc = Scenario(
        model=kw["model"],
        gpu=kw["gpu"],
        tp=kw["tp"],
        pp=kw["pp"],
        ep=kw["ep"],
        quant=kw["quant"],
        kv_cache_dtype=kw["kv_cache_dtype"],
        max_model_len=kw["max_model_len"],
        max_num_seqs=kw["max_num_seqs"],
        max_num_batched_tokens=kw["max_num_batched_tokens"],
        gpu_memory_utilization=kw["gpu_memory_utilization"],
        enable_prefix_caching=kw["enable_prefix_caching"],
        trace=kw["trace"],
        trace_format=kw["trace_format"],
        speedup=kw["speedup"],
        trace_start_s=kw["trace_start_s"],
        duration_s=kw["duration"],
        num_requests=kw["num_requests"],
        rate=kw["rate"],
        rate_steps=parse_rate_steps(kw["rate_steps"]) if kw["rate_steps"] else (),
        concurrency=kw["concurrency"],
        burstiness=kw["burstiness"],
        input_tokens=kw["input_tokens"],
        output_tokens=kw["output_tokens"],
        range_ratio=kw["range_ratio"],
        prefix_groups=kw["prefix_groups"],
        prefix_tokens=kw["prefix_tokens"],
        sessions=kw["sessions"],
        turns=kw["turns"],
        seed=kw["seed"],
        lora_adapters=kw["lora_adapters"],
        lora_zipf=kw["lora_zipf"],
        max_loras=kw["max_loras"],
        max_lora_rank=kw["max_lora_rank"],
        replicas=kw["replicas"],
        routing=kw["policy"],
        routing_options=_parse_kv(kw["policy_option"], "--policy-option"),
        autoscale=kw["autoscale"],
        autoscale_params=_parse_kv(kw["autoscale_param"], "--autoscale-param"),
        min_replicas=kw["min_replicas"],
        max_replicas=kw["max_replicas"],
        startup_s=kw["startup_s"],
        autoscale_interval_s=kw["autoscale_interval_s"],
        drain_deadline_s=kw["drain_deadline_s"],
        scrape_interval_s=kw["scrape_interval_s"],
        queue_timeout_s=kw["queue_timeout_s"],
        queue_max_size=kw["queue_max_size"],
        tail_s=kw["tail_s"],
    )
    if kw["report"] and kw["sweep"]:
        raise UserError(
            "a report covers one run", field="--report", fix="drop --sweep, or drop --report"
        )
    with JsonOut(kw["json_path"]) as json_out:
        _run(kw, sc, json_out)


def _run(kw: dict[str, Any], sc: Any, json_out: JsonOut) -> None:
    from gpufleet.sim.report import comparison_row, comparison_table, format_summary
    from gpufleet.sim.scenario import run_many, run_scenario

    out: dict[str, Any]
    if kw["ray_address"] and not kw["sweep"]:
        raise UserError("--ray-address runs a sweep", field="--ray-address", fix="add --sweep")
    if kw["sweep"]:
        field, values = _parse_sweep(kw["sweep"])
        names = [label for label, _ in values]
        scenarios = [
            sc.with_field(field, value).with_field("name", f"{field}={label}")
            for label, value in values
        ]
        # Validate every scenario here (fast) so a typo fails before any run starts.
        from gpufleet.sim.scenario import build_config

        for s in scenarios:
            build_config(s)
        if kw["ray_address"]:
            from gpufleet.sim.ray_sweep import run_many_on_ray

            summaries = run_many_on_ray(scenarios, kw["ray_address"])
        else:
            summaries = run_many(scenarios, kw["workers"])
        rows = [comparison_row(s["scenario"], s) for s in summaries]
        click.echo(f"sweep over {field}: {', '.join(names)}")
        click.echo(comparison_table(rows))
        out = {"sweep": field, "rows": rows, "runs": summaries}
    elif kw["report"]:
        from gpufleet.sim.report import summarize
        from gpufleet.sim.scenario import run_scenario_result

        result = run_scenario_result(sc)
        summary = summarize(result)
        summary["scenario"] = sc.name or sc.routing
        click.echo(format_summary(summary, title=f"gpufleet sim ({sc.routing})"))
        for path in write_sim_report(result, summary, kw["report"]):
            click.echo(f"wrote {path}")
        out = summary
    else:
        summary = run_scenario(sc)
        click.echo(format_summary(summary, title=f"gpufleet sim ({sc.routing})"))
        out = summary
    written = json_out.write(out)
    if written:
        click.echo(f"wrote {written}")


def write_sim_report(result: Any, summary: dict[str, Any], directory: str) -> list[Any]:
    """The run as a report: requests in virtual time, fleet size, scaling decisions."""
    from gpufleet.report import Decision, RequestPoint, RunRecord, write_report

    record = RunRecord(
        title=f"gpufleet sim ({summary.get('scenario', '')})",
        requests=[
            RequestPoint(r.arrival_s, r.ok, r.ttft_s, r.tpot_s, r.e2e_s) for r in result.requests
        ],
        replicas=[(t, total) for t, _, total in result.fleet_size],
        ready=[(t, ready) for t, ready, _ in result.fleet_size],
        decisions=[
            Decision(d.now_s, d.current_replicas, d.desired_replicas, d.reason)
            for d in result.scaling_changes
        ],
        summary={k: v for k, v in summary.items() if isinstance(v, int | float | str)},
        notes=["times are virtual seconds of the simulated run"],
    )
    return write_report(record, directory)
