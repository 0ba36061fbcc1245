"""A self-contained HTML summary: key figures, the pictures inlined, the scaling decisions."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from gpufleet.report.record import RunRecord


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def render_html(record: RunRecord, images: list[tuple[str, Path]]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{_fmt(v)}</td></tr>"
        for k, v in record.summary.items()
    )
    pictures = "".join(
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(caption)}'
        "</figcaption></figure>"
        for caption, p in images
    )
    decisions = "".join(
        f"<tr><td>{d.t_s:.1f}</td><td>{d.current} → {d.desired}</td>"
        f"<td>{html.escape(d.reason)}</td></tr>"
        for d in record.decisions
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in record.notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(record.title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 4px 10px; text-align: left; font-size: 14px; }}
th {{ background: #f4f4f4; font-weight: 600; }}
img {{ max-width: 100%; }} figure {{ margin: 1.5em 0; }}
figcaption {{ color: #555; font-size: 13px; }}
</style></head><body>
<h1>{html.escape(record.title)}</h1>
<ul>{notes}</ul>
<h2>Key figures</h2><table>{rows}</table>
<h2>Pictures</h2>{pictures}
<h2>Scaling decisions ({len(record.decisions)})</h2>
<table><tr><th>time (s)</th><th>replicas</th><th>why</th></tr>{decisions}</table>
</body></html>
"""
