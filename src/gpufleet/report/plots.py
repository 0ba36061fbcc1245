"""The report's pictures (needs the `plot` extra: matplotlib, imported lazily).

Each function draws one PNG from a `RunRecord`, labelled with units:
  replicas_and_load  replicas (holding a GPU, ready) and scaling decisions over time, with
                     the offered load (requests/s) beneath
  latency_over_time  TTFT and TPOT p50 / p90 / p99 per time bin
  latency_cdf        CDFs of TTFT, TPOT and end-to-end latency
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.report.record import RunRecord


def pyplot(flag: str = "--report") -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(
            "plotting needs matplotlib, which is not installed",
            field=flag,
            fix="pip install 'gpufleet[plot]'",
        ) from None
    return plt


def _end_s(record: RunRecord) -> float:
    times = [t for t, _ in record.replicas] + [r.sent_s for r in record.requests]
    return max(times, default=1.0) or 1.0


def _bin_s(end_s: float) -> float:
    """About 40 bins over the run, at a round width."""
    raw = end_s / 40
    for width in (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600):
        if raw <= width:
            return float(width)
    return float(math.ceil(raw / 600) * 600)


def _percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q))


def replicas_and_load(record: RunRecord, path: Path) -> Path:
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})  # fmt: skip
    if record.replicas:
        ts, ns = zip(*record.replicas, strict=True)
        top.step(ts, ns, where="post", label="replicas holding a GPU", linewidth=2)
    if record.ready:
        ts, ns = zip(*record.ready, strict=True)
        top.step(ts, ns, where="post", label="replicas ready", linestyle="--")
    for d in record.decisions:
        up = d.desired > d.current
        top.annotate("", xy=(d.t_s, d.desired), xytext=(d.t_s, d.current),
                     arrowprops={"arrowstyle": "->", "color": "tab:green" if up else "tab:red"})  # fmt: skip
    if record.decisions:
        top.plot([], [], color="tab:green", label="scale-out decision")
        top.plot([], [], color="tab:red", label="scale-in decision")
    top.set_ylabel("replicas")
    top.set_title(f"{record.title}: replicas and load over time")
    top.legend(loc="upper left", fontsize=8)
    top.grid(True, alpha=0.3)
    top.set_ylim(bottom=0)
    width = _bin_s(_end_s(record))
    bins = int(_end_s(record) // width) + 1
    sent = [0] * bins
    failed = [0] * bins
    for r in record.requests:
        i = min(int(r.sent_s // width), bins - 1)
        sent[i] += 1
        failed[i] += 0 if r.ok else 1
    xs = [i * width for i in range(bins)]
    bottom.bar(xs, [n / width for n in sent], width=width, align="edge", alpha=0.6,
               label="requests sent")  # fmt: skip
    if any(failed):
        bottom.bar(xs, [n / width for n in failed], width=width, align="edge", color="tab:red",
                   label="requests failed")  # fmt: skip
    bottom.set_ylabel("requests/s")
    bottom.set_xlabel("time since start (s)")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_over_time(record: RunRecord, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    width = _bin_s(_end_s(record))
    for ax, attr, name in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
        by_bin: dict[int, list[float]] = {}
        for r in record.requests:
            v = getattr(r, attr)
            if r.ok and v is not None:
                by_bin.setdefault(int(r.sent_s // width), []).append(v * 1000)
        keys = sorted(by_bin)
        xs = [(k + 0.5) * width for k in keys]
        for q, style in ((50, "-"), (90, "--"), (99, ":")):
            ax.plot(xs, [_percentile(by_bin[k], q) for k in keys], style, marker=".",
                    label=f"p{q}")  # fmt: skip
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} percentiles per {width:g} s of arrivals")
        ax.grid(True, alpha=0.3)
        if keys:
            ax.legend(loc="upper left", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no completed requests", transform=ax.transAxes, ha="center")
    axes[1].set_xlabel("time since start (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_cdf(record: RunRecord, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, attr, name in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "E2E latency"),
                              strict=True):  # fmt: skip
        xs = sorted(
            v * 1000 for r in record.requests if r.ok and (v := getattr(r, attr)) is not None
        )
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post")
            for q in (50, 90, 99):
                ax.axvline(_percentile(xs, q), color="grey", linestyle=":", linewidth=0.8)
        else:
            ax.text(0.5, 0.5, "no completed requests", transform=ax.transAxes, ha="center")
        ax.set_title(f"{name} CDF (dotted: p50, p90, p99)", fontsize=10)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
