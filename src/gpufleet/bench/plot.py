"""Plots (optional extra `plot`: pip install 'gpufleet[plot]'). matplotlib is imported lazily.

One run: CDFs of TTFT and TPOT. A sweep: latency (mean and p99 TTFT, TPOT) and
throughput versus the swept load, with the knee marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.bench.report import BenchReport, SweepReport
from gpufleet.errors import UserError


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(
            "plotting needs matplotlib, which is not installed",
            field="--plot",
            fix="pip install 'gpufleet[plot]' (or drop --plot)",
        ) from None
    return plt


def _cdf(ax: Any, values_ms: list[float], title: str) -> None:
    xs = sorted(values_ms)
    if xs:
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post")
    ax.set_title(title)
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of requests")
    ax.grid(True, alpha=0.3)


def plot_report(report: BenchReport, path: str | Path) -> None:
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    _cdf(a, [x * 1000 for x in report.ttfts_s], "TTFT CDF")
    _cdf(b, [x * 1000 for x in report.tpots_s], "TPOT CDF")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_sweep(sweep: SweepReport, path: str | Path) -> None:
    plt = _pyplot()
    xs = sweep.values
    ms = [r.metrics for r in sweep.reports]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4))
    lat.plot(xs, [m.ttft_ms["mean"] for m in ms], "o-", label="TTFT mean")
    lat.plot(xs, [m.ttft_ms.get("p99", m.ttft_ms["mean"]) for m in ms], "o--", label="TTFT p99")
    lat.plot(xs, [m.tpot_ms["mean"] for m in ms], "s-", label="TPOT mean")
    lat.plot(xs, [m.tpot_ms.get("p99", m.tpot_ms["mean"]) for m in ms], "s--", label="TPOT p99")
    lat.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")  # 40, not 4×10¹
    lat.yaxis.set_major_formatter(plain)
    lat.yaxis.set_minor_formatter(plain)
    lat.set_xlabel(sweep.param)
    lat.set_ylabel("ms")
    lat.set_title(f"Latency vs {sweep.param}")
    thr.plot(xs, [m.request_throughput for m in ms], "o-", label="requests/s")
    if sweep.param == "rate":
        thr.plot(xs, xs, ":", color="grey", label="offered")
    thr.set_xlabel(sweep.param)
    thr.set_ylabel("requests/s")
    thr.set_title(f"Throughput vs {sweep.param}")
    tok = thr.twinx()
    tok.plot(xs, [m.output_throughput for m in ms], "^-", color="tab:green", label="output tok/s")
    tok.set_ylabel("output tokens/s")
    knee = sweep.knee_value
    for ax in (lat, thr):
        if knee is not None:
            ax.axvline(knee, color="red", alpha=0.6, linestyle="-.", label=f"knee ({knee:g})")
        ax.grid(True, alpha=0.3)
    lat.legend(loc="upper left", fontsize=8)
    handles, labels = thr.get_legend_handles_labels()
    tok_handles, tok_labels = tok.get_legend_handles_labels()
    thr.legend(handles + tok_handles, labels + tok_labels, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
