"""What `gpufleet sim` shows and writes besides its text report: a progress bar while a
long run plays, the `--plot` PNG and the `--report` directory (`gpufleet.report`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from gpufleet.report import Decision, RequestPoint, RunRecord
from gpufleet.sim.results import SimResult
from gpufleet.sim.simulator import Progress as SimProgress


def run_record(result: SimResult, summary: dict[str, Any]) -> RunRecord:
    """The run as `gpufleet.report` draws it: requests on the virtual clock, the fleet's
    size at every change, and the scaling decisions that changed it."""
    return RunRecord(
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


def write_plot(result: SimResult, summary: dict[str, Any], path: str) -> Path:
    from gpufleet.report.overview import write_overview

    return write_overview(run_record(result, summary), path)


def write_report_dir(result: SimResult, summary: dict[str, Any], directory: str) -> list[Path]:
    from gpufleet.report import write_report

    return write_report(run_record(result, summary), directory)


def _bar(console: Console, label: str) -> Progress:
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


@contextlib.contextmanager
def run_progress(enabled: bool | None) -> Iterator[Callable[[SimProgress], None] | None]:
    """A progress callback for `FleetSimulator.run` drawing a bar on stderr: requests
    ended of all, and the virtual clock. `enabled` None: only when stderr is a terminal."""
    console = Console(stderr=True)
    if not (console.is_terminal if enabled is None else enabled):
        yield None
        return
    with _bar(console, "simulating") as bar:
        task = bar.add_task("run", total=None, note="")

        def update(p: SimProgress) -> None:
            bar.update(task, total=p.requests_total, completed=p.requests_done,
                       note=f"virtual {p.virtual_s:,.0f} s")  # fmt: skip

        yield update


@contextlib.contextmanager
def sweep_progress(enabled: bool | None, total: int) -> Iterator[Callable[[int], None] | None]:
    """A callback counting a sweep's finished scenarios, as a bar on stderr."""
    console = Console(stderr=True)
    if not (console.is_terminal if enabled is None else enabled):
        yield None
        return
    with _bar(console, "sweep") as bar:
        task = bar.add_task("sweep", total=total, note="scenarios")

        def update(done: int) -> None:
            bar.update(task, completed=done)

        yield update
