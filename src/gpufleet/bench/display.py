"""Rich rendering: a live progress bar and the final tables (vLLM's layout)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufleet.bench.report import BenchReport, SweepReport
from gpufleet.stats import format_percentile


class ProgressBar:
    """A rich progress bar fed by `run_benchmark`'s on_progress callback."""

    def __init__(self, console: Console, label: str = "requests"):
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task(label, total=None, failed=0)

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, done: int, failed: int, total: int | None) -> None:
        self._progress.update(self._task, completed=done, total=total, failed=failed)


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def describe_load(cfg: dict[str, Any]) -> str:
    """One line saying how requests arrived, e.g. 'Poisson 8 req/s, cap 64'."""
    if cfg.get("concurrency"):
        return f"closed loop, concurrency {cfg['concurrency']}"
    if cfg.get("trace"):
        text = f"trace replay ×{cfg.get('speedup', 1):g}"
    elif cfg.get("ramp"):
        start, end = cfg["ramp"]
        text = f"linear ramp {start:g}→{end:g} req/s"
    elif cfg.get("rate") in (None, "inf"):
        text = "all at once (rate inf)"
    else:
        b = cfg.get("burstiness", 1.0)
        kind = "Poisson" if b == 1.0 else "constant" if b == "inf" else f"gamma (burstiness {b:g})"
        text = f"{kind} {cfg['rate']:g} req/s"
    if cfg.get("max_concurrency"):
        text += f", cap {cfg['max_concurrency']}"
    return text


def describe_workload(cfg: dict[str, Any]) -> str:
    if cfg.get("trace"):
        return f"trace {Path(cfg['trace']).name}"
    sizes = f"{cfg['input_tokens']}→{cfg['output_tokens']} tokens"
    if cfg.get("range_ratio"):
        sizes += f" ±{cfg['range_ratio']:.0%}"
    if cfg.get("sessions"):
        return f"{cfg['sessions']} sessions × {cfg['turns']} turns, {sizes} per turn"
    if cfg.get("prefix_groups"):
        return f"{cfg['prefix_groups']} prefix groups of {cfg['prefix_tokens']} tokens + {sizes}"
    return f"random, {sizes}"


def result_table(report: BenchReport) -> Table:
    m = report.metrics
    cfg = report.config
    t = Table(title="Serving Benchmark Result", show_header=False, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("Target", f"{cfg.get('url')} ({cfg.get('endpoint')}, {cfg.get('model')})")
    t.add_row("Arrivals", describe_load(cfg))
    t.add_row("Workload", describe_workload(cfg))
    t.add_row("Successful requests", str(m.completed))
    t.add_row("Failed requests", str(m.failed))
    t.add_row("Benchmark duration (s)", _f(m.duration_s))
    t.add_row("Total input tokens", str(m.total_input_tokens))
    t.add_row("Total generated tokens", str(m.total_output_tokens))
    t.add_row("Request throughput (req/s)", _f(m.request_throughput))
    if m.request_goodput is not None:
        slo = " ".join(f"{k}:{v:g}" for k, v in m.goodput_slo_ms.items())
        t.add_row(f"Request goodput (req/s) [{slo} ms]", _f(m.request_goodput))
    t.add_row("Output token throughput (tok/s)", _f(m.output_throughput))
    t.add_row("Peak output token throughput (tok/s)", _f(m.max_output_tokens_per_s))
    t.add_row("Peak concurrent requests", str(m.max_concurrent_requests))
    t.add_row("Total token throughput (tok/s)", _f(m.total_token_throughput))
    for title, key, series in (
        ("Time to First Token", "TTFT", m.ttft_ms),
        ("Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms),
        ("Inter-token Latency", "ITL", m.itl_ms),
        ("End-to-end Latency", "E2EL", m.e2el_ms),
    ):
        t.add_section()
        t.add_row(f"[bold]{title}[/bold]", "")
        for stat, value in series.items():
            name = stat.capitalize() if not stat.startswith("p") else stat.upper()
            t.add_row(f"{name} {key} (ms)", _f(value))
    return t


def failures_table(report: BenchReport) -> Table | None:
    if not report.metrics.failures:
        return None
    t = Table(title="Failures", title_justify="left")
    t.add_column("status")
    t.add_column("error type")
    t.add_column("count", justify="right")
    t.add_column("example")
    for f in report.metrics.failures:
        t.add_row(
            str(f.status) if f.status is not None else "-",
            f.error_type,
            str(f.count),
            f.example[:80],
        )
    return t


def server_table(report: BenchReport) -> Table:
    t = Table(
        title="Server-side (from /metrics, after − before)", show_header=False, title_justify="left"
    )
    t.add_column("series")
    t.add_column("delta", justify="right")
    if report.server is None:
        t.add_row("unavailable", report.server_note or "-")
        return t
    known = {k: v for k, v in report.server.known().items() if v is not None}
    for k, v in known.items():
        t.add_row(k, f"{v:.1%}" if k.endswith("_rate") else _f(v, 0))
    for replica, series in sorted(report.server.per_replica().items()):
        for name, v in series.items():
            if v:  # zero deltas stay in --json
                t.add_row(f"replica {replica}: {name}", _f(v, 0))
    if not known:
        for shown, (name, v) in enumerate(report.server.to_dict()["counter_deltas"].items()):
            if shown >= 15:
                t.add_row("…", "(all in --json)")
                break
            t.add_row(name, _f(v, 0))
    return t


def client_table(report: BenchReport) -> Table:
    c = report.client
    t = Table(title="Client overhead", show_header=False, title_justify="left")
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row(
        "Event-loop lag mean / p99 / max (ms)",
        f"{c.loop_lag_mean_ms:.2f} / {c.loop_lag_p99_ms:.2f} / {c.loop_lag_max_ms:.2f}",
    )
    t.add_row("Client CPU (cores)", f"{c.cpu_util:.2f}")
    if c.schedule_lag_mean_ms is not None:
        t.add_row(
            "Send lag behind schedule mean / p99 (ms)",
            f"{c.schedule_lag_mean_ms:.2f} / {_f(c.schedule_lag_p99_ms)}",
        )
    if c.saturated:
        t.add_row(
            "[bold red]warning[/bold red]",
            "the client kept its core busy: it may be the bottleneck",
        )
    elif c.starved:
        t.add_row(
            "[bold red]warning[/bold red]",
            "the machine is busy: the client waited for CPU, timestamps may be late by the loop lag",
        )
    return t


def print_report(console: Console, report: BenchReport) -> None:
    console.print(result_table(report))
    failures = failures_table(report)
    if failures is not None:
        console.print(failures)
    console.print(server_table(report))
    console.print(client_table(report))


def sweep_table(sweep: SweepReport, percentile: float = 99.0) -> Table:
    p = f"p{format_percentile(percentile)}"
    t = Table(title=f"Sweep over {sweep.param}", title_justify="left")
    t.add_column(sweep.param, justify="right")
    for name in (
        "req/s",
        "out tok/s",
        "TTFT mean",
        f"TTFT {p}",
        "TPOT mean",
        f"TPOT {p}",
        "goodput",
        "failed",
        "",
    ):
        t.add_column(name, justify="right")
    for i, (v, r) in enumerate(zip(sweep.values, sweep.reports, strict=True)):
        m = r.metrics
        t.add_row(
            f"{v:g}",
            _f(m.request_throughput),
            _f(m.output_throughput, 0),
            _f(m.ttft_ms["mean"], 1),
            _f(m.ttft_ms.get(p), 1),
            _f(m.tpot_ms["mean"], 1),
            _f(m.tpot_ms.get(p), 1),
            _f(m.request_goodput),
            str(m.failed),
            "[bold]◀ knee[/bold]" if i == sweep.knee_index else "",
        )
    t.caption = f"knee: {sweep.knee_rule} (latencies in ms)"
    return t
