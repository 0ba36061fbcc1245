"""Run reports a person would rather look at than read: PNG plots and one HTML page.

    from gpufleet.report import RunRecord, RequestPoint, Decision, write_report
    paths = write_report(record, "out/report")   # needs the `plot` extra (matplotlib)

`gpufleet up --report DIR` and `gpufleet sim --report DIR` fill a `RunRecord` and call
`write_report`; the single plots (`gpufleet.report.plots`) can be drawn one by one.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.report.record import Decision, RequestPoint, RunRecord

__all__ = ["Decision", "RequestPoint", "RunRecord", "write_report"]


def write_report(record: RunRecord, directory: str | Path) -> list[Path]:
    """Three PNGs and index.html (pictures inlined) in `directory`; their paths."""
    from gpufleet.report import plots
    from gpufleet.report.html import render_html

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    images = [
        ("Replicas and load over time", plots.replicas_and_load(record, out / "replicas_load.png")),
        (
            "Latency percentiles over time",
            plots.latency_over_time(record, out / "latency_time.png"),
        ),
        ("Latency CDFs", plots.latency_cdf(record, out / "latency_cdf.png")),
    ]
    page = out / "index.html"
    page.write_text(render_html(record, images))
    return [p for _, p in images] + [page]
