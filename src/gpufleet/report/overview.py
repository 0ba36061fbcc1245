"""One PNG of a whole run: the report's three pictures stacked, top to bottom.

Replicas over time (with the scaling decisions and the offered load), TTFT and TPOT
percentiles over time, and the latency CDFs: `gpufleet sim --plot FILE.png` writes it.
The pictures are `gpufleet.report.plots`' own; this only stacks them (needs the `plot`
extra: matplotlib).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from gpufleet.report import plots
from gpufleet.report.record import RunRecord


def write_overview(record: RunRecord, path: str | Path, flag: str = "--plot") -> Path:
    """The three pictures of `record` in one PNG at `path` (widths padded with white)."""
    plt = plots.pyplot(flag)
    import numpy as np

    out = Path(path)
    with tempfile.TemporaryDirectory(prefix="gpufleet-plot-") as tmp:
        d = Path(tmp)
        parts = [
            plots.replicas_and_load(record, d / "replicas.png"),
            plots.latency_over_time(record, d / "latency.png"),
            plots.latency_cdf(record, d / "cdf.png"),
        ]
        images = [np.asarray(plt.imread(p), dtype=np.float32) for p in parts]
    width = max(im.shape[1] for im in images)
    padded = []
    for im in images:
        if im.shape[2] == 3:  # no alpha channel: add an opaque one
            im = np.concatenate([im, np.ones((*im.shape[:2], 1), np.float32)], axis=2)
        pad = np.ones((im.shape[0], width - im.shape[1], 4), np.float32)
        padded.append(np.concatenate([im, pad], axis=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(out, np.concatenate(padded, axis=0))
    return out
