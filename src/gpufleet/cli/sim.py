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
@click.option(
    "--trace-copies", default=1, show_default=True, type=click.IntRange(min=1),
    help="Replay N interleaved copies of the trace: N× its rate over the same span.",
)  # fmt: skip
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
@click.option(
    "--slow-start-s", default=0.0, show_default=True, type=float,
    help="A replica that becomes ready ramps its routing share over this window (0: off).",
)  # fmt: skip
@click.option("--queue-timeout-s", default=60.0, show_default=True, type=float)
@click.option(
    "--queue-max-size", default=256, show_default=True, type=click.IntRange(min=0),
    help="Gateway queue bound: requests beyond it get the gateway's 503.",
)  # fmt: skip
@click.option("--tail-s", default=0.0, show_default=True, type=float, help="Idle time after.")
@click.option(
    "--max-attempts", default=3, show_default=True, type=click.IntRange(1, 10),
    help="Gateway: tries of a request whose replica fails before its first token.",
)  # fmt: skip
# production: heterogeneous groups, tenants, failures, cost
@click.option(
    "--config", "config_path", default=None,
    help="YAML: replica groups (GPU types, layouts, pools), tenants, failures (docs/sim.md).",
)  # fmt: skip
@click.option("--mtbf-s", default=None, type=float, help="Replica failures: mean time between.")
@click.option(
    "--restart-crashed/--no-restart-crashed", default=True, show_default=True,
    help="A crashed replica is restarted after its backoff and a cold start.",
)  # fmt: skip
@click.option("--gpu-price", default=None, type=float, help="$ per GPU-hour (default: catalog).")
@click.option(
    "--time-scale", default=1.0, show_default=True, type=float,
    help="As gpufleet replica --time-scale: every engine step takes this many times longer.",
)  # fmt: skip
@click.option(
    "--request-overhead-s", default=0.0, show_default=True, type=float,
    help="The HTTP path (client, gateway, replica) before the engine sees a request.",
)  # fmt: skip
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
    "--plot", "plot_path", default=None,
    help="Write one PNG here: replicas over time, TTFT/TPOT over time, latency CDFs "
    "(needs the plot extra).",
)  # fmt: skip
@click.option(
    "--report", "report_dir", default=None, type=click.Path(file_okay=False),
    help="Write PNG plots and an HTML summary into this directory (needs the plot extra).",
)  # fmt: skip
@click.option(
    "--progress/--no-progress", default=None,
    help="Progress bar on stderr (default: when stderr is a terminal).",
)  # fmt: skip
def command(**kw: Any) -> None:
    """Simulate a fleet of replicas behind a router (and an autoscaler) on a virtual clock."""
    from gpufleet.sim.fleet_spec import load_sim_fleet
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
        trace_copies=kw["trace_copies"],
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
        slow_start_s=kw["slow_start_s"],
        queue_timeout_s=kw["queue_timeout_s"],
        queue_max_size=kw["queue_max_size"],
        tail_s=kw["tail_s"],
        max_attempts=kw["max_attempts"],
        gpu_price=kw["gpu_price"],
        mtbf_s=kw["mtbf_s"],
        restart_crashed=kw["restart_crashed"],
        time_scale=kw["time_scale"],
        request_overhead_s=kw["request_overhead_s"],
        fleet=load_sim_fleet(kw["config_path"]) if kw["config_path"] else None,
    )
    if kw["sweep"] and (kw["plot_path"] or kw["report_dir"]):
        flag = "--plot" if kw["plot_path"] else "--report"
        raise UserError("a plot covers one run", field=flag, fix=f"drop --sweep, or drop {flag}")
    if kw["plot_path"] or kw["report_dir"]:
        from gpufleet.report.plots import pyplot

        pyplot("--plot" if kw["plot_path"] else "--report")  # fail before the run, not after
    with JsonOut(kw["json_path"]) as json_out:
        _run(kw, sc, json_out)


def _run(kw: dict[str, Any], sc: Any, json_out: JsonOut) -> None:
    from gpufleet.cli.sim_output import (
        run_progress,
        sweep_progress,
        write_plot,
        write_report_dir,
    )
    from gpufleet.sim.report import comparison_row, comparison_table, format_summary, summarize
    from gpufleet.sim.scenario import run_many, run_scenario_result

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
            with sweep_progress(kw["progress"], len(scenarios)) as on_done:
                summaries = run_many(scenarios, kw["workers"], on_done)
        rows = [comparison_row(s["scenario"], s) for s in summaries]
        click.echo(f"sweep over {field}: {', '.join(names)}")
        click.echo(comparison_table(rows))
        out = {"sweep": field, "rows": rows, "runs": summaries}
    else:
        with run_progress(kw["progress"]) as progress:
            result = run_scenario_result(sc, progress)
        summary = summarize(result)
        summary["scenario"] = sc.name or sc.routing
        click.echo(format_summary(summary, title=f"gpufleet sim ({sc.routing})"))
        if kw["plot_path"]:
            click.echo(f"wrote {write_plot(result, summary, kw['plot_path'])}")
        if kw["report_dir"]:
            for path in write_report_dir(result, summary, kw["report_dir"]):
                click.echo(f"wrote {path}")
        out = summary
    written = json_out.write(out)
    if written:
        click.echo(f"wrote {written}")
