"""`gpufleet bench`: measure any OpenAI-compatible endpoint the way vLLM's benchmark does."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import sys
from typing import Any

import click

from gpufleet.cli.jsonout import JsonOut, json_option
from gpufleet.cli.urls import base_url
from gpufleet.errors import UserError

_GOODPUT_ITEM = re.compile(r"^(ttft|tpot|e2el):[0-9.]+$", re.IGNORECASE)


def _parse_ramp(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(start), float(end)
    except ValueError:
        raise UserError(
            f"bad ramp {text!r}", field="--ramp", fix="START:END requests/s, e.g. 1:20"
        ) from None


def _parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise UserError(
            f"bad percentiles {text!r}", field="--percentiles", fix="e.g. 50,90,99"
        ) from None


def _parse_extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UserError(
            f"not JSON: {e}", field="--extra-body", fix="e.g. '{\"temperature\": 0}'"
        ) from None
    if not isinstance(value, dict):
        raise UserError(
            "must be a JSON object", field="--extra-body", fix="e.g. '{\"temperature\": 0}'"
        )
    return value


@click.command(
    name="bench",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": False},
)
@click.option(
    "--url", required=True, help="Server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)."
)
@click.option("--model", default=None, help="Model name; default: the first of GET /v1/models.")
@click.option(
    "--endpoint",
    type=click.Choice(["completions", "chat"]),
    default="completions",
    show_default=True,
)
@click.option(
    "--api-key", envvar="OPENAI_API_KEY", default=None, help="Bearer token (or $OPENAI_API_KEY)."
)
@click.option(
    "--rate",
    type=float,
    default=math.inf,
    show_default=True,
    help="Requests (or sessions) per second; inf sends all at once.",
)
@click.option(
    "--burstiness",
    type=float,
    default=1.0,
    show_default=True,
    help="Gamma shape: 1 Poisson, <1 burstier, inf constant rate.",
)
@click.option(
    "--concurrency",
    type=int,
    default=None,
    help="Closed loop: keep exactly this many requests in flight.",
)
@click.option(
    "--max-concurrency", type=int, default=None, help="Open loop: cap on requests in flight."
)
@click.option(
    "--ramp",
    default=None,
    metavar="START:END",
    help="Linear rate ramp across the run (needs --num-requests).",
)
@click.option(
    "--num-requests",
    type=int,
    default=None,
    help="Requests to send (default 1000, or all sessions' turns).",
)
@click.option(
    "--duration",
    "duration_s",
    type=float,
    default=None,
    help="Stop sending after this many seconds.",
)
@click.option(
    "--input-tokens",
    type=int,
    default=1024,
    show_default=True,
    help="Words of new user text per request (see README for chat).",
)
@click.option(
    "--output-tokens", type=int, default=128, show_default=True, help="max_tokens per request."
)
@click.option(
    "--range-ratio",
    type=float,
    default=0.0,
    show_default=True,
    help="Lengths uniform in [L(1-r), L(1+r)].",
)
@click.option(
    "--trace",
    type=click.Path(dir_okay=False),
    default=None,
    help="Replay an Azure CSV or Mooncake JSONL trace (.gz too), or sample:mooncake / sample:azure.",
)
@click.option(
    "--trace-format",
    type=click.Choice(["auto", "azure", "mooncake"]),
    default="auto",
    show_default=True,
)
@click.option(
    "--speedup",
    type=float,
    default=1.0,
    show_default=True,
    help="Trace replay speed (2 = twice as fast).",
)
@click.option(
    "--prefix-groups", type=int, default=None, help="Requests share one of N fixed prefixes."
)
@click.option(
    "--prefix-tokens",
    type=int,
    default=0,
    show_default=True,
    help="Tokens of each group's shared prefix.",
)
@click.option(
    "--sessions", type=int, default=None, help="Multi-turn sessions; each turn resends the history."
)
@click.option("--turns", type=int, default=1, show_default=True, help="Turns per session.")
@click.option(
    "--sweep",
    default=None,
    metavar="PARAM=V1,V2,...",
    help="e.g. rate=2,4,8,16 or concurrency=1,4,16.",
)
@click.option(
    "--goodput",
    multiple=True,
    metavar="KEY:MS",
    help="SLOs for goodput, e.g. --goodput ttft:500 tpot:50.",
)
@click.option(
    "--percentiles", default="50,90,95,99", show_default=True, help="Percentiles to report."
)
@click.option("--ignore-eos", is_flag=True, help="Ask the server to ignore EOS (vLLM extension).")
@click.option("--extra-body", default=None, help="JSON object merged into every request body.")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=600.0,
    show_default=True,
    help="Per-request timeout (s).",
)
@click.option(
    "--warmup",
    "warmup_requests",
    type=int,
    default=0,
    show_default=True,
    help="Requests sent and discarded first.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-scrape", is_flag=True, help="Do not read the target's /metrics.")
@click.option(
    "--metrics-url",
    "metrics_urls",
    multiple=True,
    help="Also scrape this server's /metrics (repeatable; e.g. the replicas behind a gateway).",
)
@json_option("the full result")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write plots (needs the 'plot' extra).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_context
def command(ctx: click.Context, **opts: Any) -> None:
    """Measure TTFT, TPOT, ITL, E2E latency, throughput and goodput of an OpenAI-compatible endpoint."""
    from rich.console import Console

    from gpufleet.bench.config import BenchConfig
    from gpufleet.bench.metrics import parse_goodput

    goodput_items = list(opts.pop("goodput"))
    extra = list(ctx.args)
    # `--goodput ttft:500 tpot:50`: the second item arrives as an extra argument.
    if extra and goodput_items and all(_GOODPUT_ITEM.match(a) for a in extra):
        goodput_items += extra
    elif extra:
        raise UserError(
            f"unexpected argument(s): {' '.join(extra)}", fix="see gpufleet bench --help"
        )
    try:
        goodput = parse_goodput(goodput_items)
    except ValueError as e:
        raise UserError(str(e), field="--goodput", fix="e.g. --goodput ttft:500 tpot:50") from None

    explicit = ctx.get_parameter_source("endpoint") is click.core.ParameterSource.COMMANDLINE
    opts["url"], opts["endpoint"] = base_url(opts["url"], opts["endpoint"], explicit)
    sweep_spec = opts.pop("sweep")
    json_path = opts.pop("json_path")
    plot_path = opts.pop("plot_path")
    quiet = opts.pop("quiet")
    config = BenchConfig(
        url=opts["url"],
        model=opts["model"],
        endpoint=opts["endpoint"],
        api_key=opts["api_key"],
        rate=opts["rate"],
        burstiness=opts["burstiness"],
        concurrency=opts["concurrency"],
        max_concurrency=opts["max_concurrency"],
        ramp=_parse_ramp(opts["ramp"]),
        num_requests=opts["num_requests"],
        duration_s=opts["duration_s"],
        input_tokens=opts["input_tokens"],
        output_tokens=opts["output_tokens"],
        range_ratio=opts["range_ratio"],
        trace=opts["trace"],
        trace_format=opts["trace_format"],
        speedup=opts["speedup"],
        prefix_groups=opts["prefix_groups"],
        prefix_tokens=opts["prefix_tokens"],
        sessions=opts["sessions"],
        turns=opts["turns"],
        ignore_eos=opts["ignore_eos"],
        extra_body=_parse_extra_body(opts["extra_body"]),
        timeout_s=opts["timeout_s"],
        warmup_requests=opts["warmup_requests"],
        goodput_slo_ms=goodput,
        percentiles=_parse_percentiles(opts["percentiles"]),
        seed=opts["seed"],
        scrape_metrics=not opts["no_scrape"],
        extra_metrics_urls=tuple(opts["metrics_urls"]),
    ).validate()
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # files and pipes get the full tables, not 80 columns
    with JsonOut(json_path) as out:
        if sweep_spec:
            _run_sweep(console, config, sweep_spec, out, plot_path, quiet)
        else:
            _run_one(console, config, out, plot_path, quiet)


def _use_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # uvloop is optional on platforms that lack it
        pass


class _CtrlC:
    """First Ctrl-C: stop sending and report what finished. Second: abort."""

    def __init__(self, console: Any):
        self.console = console
        self.stop = asyncio.Event()
        self._main: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _pressed(self) -> None:
        if not self.stop.is_set():
            self.console.print(
                "[bold]stopping[/bold]: reporting what finished (Ctrl-C again aborts)"
            )
            self.stop.set()
        elif self._main is not None:
            self._main.cancel()

    def __enter__(self) -> _CtrlC:
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        try:
            self._loop.add_signal_handler(signal.SIGINT, self._pressed)
        except (NotImplementedError, RuntimeError):  # no signal handlers here (Windows)
            self._loop = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)


async def _one(
    config: Any, console: Any, quiet: bool, stop: asyncio.Event, label: str = "requests"
) -> Any:
    from gpufleet.bench.display import ProgressBar
    from gpufleet.bench.runner import run_benchmark

    if quiet or not console.is_terminal:
        return await run_benchmark(config, stop=stop)
    with ProgressBar(console, label) as bar:
        return await run_benchmark(config, on_progress=bar.update, stop=stop)


def _run_main(console: Any, coro_fn: Any) -> Any:
    """asyncio.run with Ctrl-C handling; a second Ctrl-C aborts (exit 130)."""

    async def main() -> Any:
        with _CtrlC(console) as ctrl_c:
            return await coro_fn(ctrl_c.stop)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        raise click.exceptions.Abort() from None


def _run_one(console: Any, config: Any, out: JsonOut, plot_path: str | None, quiet: bool) -> None:
    from gpufleet.bench.display import print_report

    _use_uvloop()
    report = _run_main(console, lambda stop: _one(config, console, quiet, stop))
    print_report(console, report)
    if report.interrupted:
        console.print("[bold]interrupted[/bold]: these figures cover the requests that finished")
    written = out.write(report.to_dict())
    if written:
        console.print(f"wrote {written}")
    if plot_path:
        from gpufleet.bench.plot import plot_report

        plot_report(report, plot_path)
        console.print(f"wrote {plot_path}")
    if report.metrics.completed == 0:
        # Scripts should notice a run where nothing worked (the table says why).
        console.print("[bold red]every request failed[/bold red]")
        sys.exit(1)


def _run_sweep(
    console: Any, config: Any, spec: str, out: JsonOut, plot_path: str | None, quiet: bool
) -> None:
    from gpufleet.bench.display import sweep_table
    from gpufleet.bench.sweep import parse_sweep, run_sweep

    param, values = parse_sweep(spec)
    _use_uvloop()

    async def sweep_all(stop: asyncio.Event) -> Any:
        async def point(cfg: Any) -> Any:
            value = cfg.rate if param == "rate" else cfg.concurrency
            return await _one(cfg, console, quiet, stop, label=f"{param}={value:g}")

        return await run_sweep(config, param, values, point, should_stop=stop.is_set)

    sweep = _run_main(console, sweep_all)
    console.print(sweep_table(sweep))
    written = out.write(sweep.to_dict())
    if written:
        console.print(f"wrote {written}")
    if plot_path:
        from gpufleet.bench.plot import plot_sweep

        plot_sweep(sweep, plot_path)
        console.print(f"wrote {plot_path}")
