"""`gpufleet up`: gateway + autoscaler + replicas in one event loop, stopped as one.

The gateway runs in-process; replicas are child processes in their own process groups
(`backend.kind: local`) or placement groups and actors on a Ray cluster (`ray`, docs/ray.md);
the controller ticks every `autoscale.interval_s`. Its decisions are served at
`GET /admin/autoscale` on the gateway (behind the admin key when one is set). On stop
(Ctrl-C, SIGTERM, or the end of the demo) the controller stops first, then every replica
process group, then the gateway: nothing is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.live import Live

from gpufleet.autoscale.actuator import FleetActuator, ManagedReplica
from gpufleet.autoscale.controller import Controller
from gpufleet.autoscale.decision import ScalingDecision
from gpufleet.autoscale.gateway_link import InProcessGateway
from gpufleet.autoscale.metrics import AutoscaleCollector
from gpufleet.autoscale.policies import make_policy
from gpufleet.fleet.backend import group_actuator
from gpufleet.fleet.config import FleetConfig, GroupSpec
from gpufleet.fleet.replica_latency import ReplicaTtft, scrape_ttft
from gpufleet.fleet.summary import ReplicaTimeline, Summary, summarize, summary_lines
from gpufleet.fleet.traffic import DEMO_PHASES, TrafficLog, drive
from gpufleet.fleet.view import Snapshot, render
from gpufleet.gateway.cadence import SCRAPE_AFTER_TICK_S
from gpufleet.routing.types import ReplicaState
from gpufleet.workload import RatePhase, phase_at, total_duration_s

log = logging.getLogger("gpufleet.up")


@dataclass(slots=True)
class GroupRun:
    """One model group's replicas and the autoscaler that sizes them."""

    spec: GroupSpec
    actuator: FleetActuator
    controller: Controller

    @property
    def name(self) -> str:
        return self.spec.label

    @property
    def model(self) -> str:
        return self.spec.replicas.model


@dataclass(slots=True)
class FleetRun:
    """Everything one `up` holds while it runs (for the view, tests and the summary).
    `actuator` and `controller` are the first group's (the only one without `groups:`)."""

    config: FleetConfig
    gateway: Any
    actuator: FleetActuator
    controller: Controller
    url: str
    started_s: float
    timeline: ReplicaTimeline = field(default_factory=ReplicaTimeline)
    ttft: ReplicaTtft = field(default_factory=ReplicaTtft)
    groups: list[GroupRun] = field(default_factory=list)

    @property
    def changes(self) -> list[ScalingDecision]:
        if len(self.groups) < 2:
            return list(self.controller.changes)
        every = [d for g in self.groups for d in g.controller.changes]
        return sorted(every, key=lambda d: d.now_s)

    @property
    def cut_requests(self) -> int:
        return sum(g.actuator.cut_requests_total for g in self.groups) or (
            self.actuator.cut_requests_total
        )

    @property
    def undrained(self) -> int:
        """Scale-outs served by taking back a draining replica (no cold start)."""
        return sum(g.actuator.undrained_total for g in self.groups) or (
            self.actuator.undrained_total
        )

    def managed(self) -> list[ManagedReplica]:
        """Every group's replicas."""
        actuators = [g.actuator for g in self.groups] or [self.actuator]
        return [m for a in actuators for m in a.list()]

    def holding(self) -> int:
        """Replicas holding a GPU right now (starting, ready or draining)."""
        return sum(1 for m in self.managed() if m.state != ReplicaState.DEAD)


def _build_gateway(cfg: FleetConfig, port: int | None, host: str | None) -> Any:
    """The gateway in this process, or (with `gateway: {workers: N}`) its supervisor with
    N worker processes: the controller drives either through the same calls."""
    try:
        from gpufleet.gateway.config import validate_config
        from gpufleet.gateway.server import Gateway
        from gpufleet.gateway.workers import WorkerPool
    except ImportError as e:  # the gateway is part of this package; say what is missing
        raise RuntimeError(f"gpufleet.gateway is not available: {e}") from e
    settings = cfg.gateway_settings()
    if port is not None:
        settings["port"] = port
    if host is not None:
        settings["host"] = host
    config = validate_config(settings, source="gateway")
    if config.workers > 1:
        return WorkerPool(config, workers=config.workers)
    return Gateway(config)


def _admin_route(gateway: Any, groups: list[GroupRun], several: bool) -> None:
    """GET /admin/autoscale: the (first) group's controller; with `groups:`, every group's
    under "groups" too."""
    from gpufleet.gateway.routes import Reply, json_reply

    def state(group: GroupRun) -> dict[str, Any]:
        body = group.controller.to_json()
        capacity = group.spec.capacity()
        body["capacity_per_replica"] = capacity.to_json() if capacity is not None else None
        return body

    async def autoscale(request: Any) -> Reply:
        body = state(groups[0])
        if several:
            body["groups"] = {g.name: {"model": g.model, **state(g)} for g in groups}
        return json_reply(body)

    # Behind the admin key when one is set, open otherwise.
    gateway.add_route("GET", "/admin/autoscale", autoscale,
                      admin=bool(getattr(gateway.config, "admin_key", None)))  # fmt: skip


@contextlib.asynccontextmanager
async def fleet_up(
    cfg: FleetConfig,
    *,
    port: int | None = None,
    host: str | None = None,
    log_dir: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """Start gateway, replicas and controller; yield a FleetRun; stop all of them on exit."""
    gateway = _build_gateway(cfg, port, host)
    if log_dir is None and cfg.log_dir:
        log_dir = Path(cfg.log_dir)
    tmp = None
    if log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpufleet-up-")
        log_dir = Path(tmp.name)
    groups: list[GroupRun] = []
    run: FleetRun | None = None
    sampler: asyncio.Task[None] | None = None
    stack = contextlib.AsyncExitStack()
    try:
        for spec in cfg.fleet_groups():
            # Each group scales on its own model's signals (queue, latency, replicas).
            link = (
                InProcessGateway(gateway, spec.replicas.model, spec.replicas.engine)
                if cfg.groups
                else InProcessGateway(gateway)
            )
            actuator = await stack.enter_async_context(
                group_actuator(cfg, spec, link, log_dir, clock)
            )
            a = spec.autoscale
            policy = make_policy(a.policy, a.bounds(), spec.policy_params())
            controller = Controller(
                policy, actuator, link.read_signals, interval_s=a.interval_s, clock=clock
            )
            groups.append(GroupRun(spec, actuator, controller))
        _admin_route(gateway, groups, several=bool(cfg.groups))
        # One scrape of the gateway shows every group's size and decisions beside its traffic.
        gateway.metrics.registry.register(
            AutoscaleCollector([(g.name, g.model, g.controller) for g in groups])
        )
        bound = await gateway.start()
        url = f"http://{gateway.host}:{bound}"
        first = groups[0]
        run = FleetRun(cfg, gateway, first.actuator, first.controller, url, clock())
        run.groups = groups
        for g in groups:
            # Replicas adopted from a previous controller (Ray) count towards the first ones.
            missing = g.spec.autoscale.first_count() - len(g.actuator.list())
            if missing > 0:
                await g.actuator.start(missing)
        ticking = [g for g in groups if g.spec.autoscale.enabled]
        # The scrapes half a tick after the (first group's) ticks, as simulated. Behind
        # --workers the gateway is a WorkerPool: each worker process scrapes on its own cadence.
        health = getattr(gateway, "health", None)
        if ticking and health is not None:
            health.align_scrapes(health.cadence_clock() + SCRAPE_AFTER_TICK_S)
        for g in ticking:
            g.controller.start()
        sampler = asyncio.get_running_loop().create_task(_sample(run, clock))
        yield run
    finally:
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        for g in groups:
            await g.controller.stop()
        await stack.aclose()  # every replica stopped
        await gateway.stop()
        if tmp is not None:
            tmp.cleanup()


async def _sample(run: FleetRun, clock: Callable[[], float]) -> None:
    """Replica-seconds (replicas holding a GPU, twice a second) and per-replica TTFT p90."""
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for tick in itertools.count():
            now = clock() - run.started_s
            run.timeline.add(now, run.holding())
            if tick % 4 == 0:
                ready = {
                    m.replica_id: m.url
                    for m in run.managed()
                    if m.state in (ReplicaState.READY, ReplicaState.DRAINING)
                }
                await scrape_ttft(session, ready, run.ttft, now)
            await asyncio.sleep(0.5)


def snapshot(
    run: FleetRun,
    clock: Callable[[], float],
    traffic: TrafficLog | None = None,
    phases: Sequence[RatePhase] = (),
    t0: float | None = None,
) -> Snapshot:
    # With traffic, the clock starts with it (the first cold start happened before).
    origin = t0 if traffic is not None and t0 is not None else run.started_s
    decisions = list(run.controller.decisions)
    snap = Snapshot(
        elapsed_s=clock() - origin,
        gateway_url=run.url,
        policy=run.controller.policy.name,
        signals=run.controller.last_signals,
        decisions=run.changes,
        latest=decisions[-1] if decisions else None,
        replica_ttft_p90_s=run.ttft.p90_s(),
        started_s=origin,
    )
    if traffic is not None and t0 is not None:
        phase, rps = phase_at(phases, clock() - t0)
        snap.phase = phase.name if phase else "draining the last requests"
        snap.target_rps = rps
        snap.sent = traffic.sent
        snap.done = len(traffic.results)
        snap.errors = sum(1 for r in traffic.results if not r.ok)
        snap.client_in_flight = traffic.in_flight
        snap.total_s = total_duration_s(phases)
    return snap


async def run_up(
    cfg: FleetConfig,
    *,
    demo: bool,
    stop: asyncio.Event,
    console: Console,
    port: int | None = None,
    host: str | None = None,
    phases: Sequence[RatePhase] = DEMO_PHASES,
    seed: int = 0,
    clock: Callable[[], float] = time.monotonic,
    report_dir: Path | None = None,
) -> Summary | None:
    """Run until `stop` is set (or, with `demo`, until the traffic has played)."""
    async with fleet_up(cfg, port=port, host=host, clock=clock) as run:
        console.print(
            f"gateway on {run.url} — OpenAI API at {run.url}/v1, decisions at "
            f"{run.url}/admin/autoscale; Ctrl-C stops everything"
        )
        for g in run.groups:
            cap = g.spec.capacity()
            if cap is not None:
                console.print(
                    (f"{g.name} ({g.model}): " if cfg.groups else "")
                    + f"{g.spec.autoscale.policy} policy: capacity_per_replica "
                    f"{cap.sequences} ({cap.describe()})",
                    markup=False,
                    highlight=False,
                )
        traffic: TrafficLog | None = None
        driver: asyncio.Task[None] | None = None
        if demo:
            # Traffic starts on a warm fleet: the show is scaling, not the first cold start.
            startup_s = max(g.spec.replicas.startup_s for g in run.groups)
            console.print(f"waiting for the first replicas (cold start ≈ {startup_s:g} s)…")
            while not stop.is_set() and not all(
                any(m.state == ReplicaState.READY for m in g.actuator.list())
                or g.spec.autoscale.min_replicas == 0
                for g in run.groups
            ):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
        t0 = clock()
        if demo and not stop.is_set():
            traffic = TrafficLog()
            driver = asyncio.get_running_loop().create_task(
                _drive_groups(run, phases, traffic, seed, stop, clock)
            )
        live_ok = console.is_terminal
        with (
            Live(
                render(snapshot(run, clock, traffic, phases, t0)),
                console=console,
                refresh_per_second=4,
                transient=False,
            )
            if live_ok
            else contextlib.nullcontext() as live
        ):
            printed = 0
            while not stop.is_set() and (driver is None or not driver.done()):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                if live is not None:
                    live.update(render(snapshot(run, clock, traffic, phases, t0)))
                else:
                    origin = t0 if traffic is not None else run.started_s
                    for d in run.changes[printed:]:
                        console.print(
                            f"[{d.now_s - origin:5.0f} s] {d.current_replicas} → "
                            f"{d.desired_replicas}: {d.reason}",
                            markup=False,
                            highlight=False,
                        )
                    printed = len(run.changes)
        if driver is not None:
            stop.set()  # stop sending; wait for what was sent
            with contextlib.suppress(asyncio.CancelledError):
                await driver
        traffic_window = (t0 - run.started_s, clock() - run.started_s)
        summary = _summary(run, traffic, traffic_window, console)
        if report_dir is not None:
            from gpufleet.fleet.report import up_record, write_up_report

            record = up_record(run, traffic, traffic_window[0], summary)
            for path in write_up_report(record, report_dir):
                console.print(f"wrote {path}", markup=False, highlight=False)
    return summary


async def _drive_groups(
    run: FleetRun,
    phases: Sequence[RatePhase],
    traffic: TrafficLog,
    seed: int,
    stop: asyncio.Event,
    clock: Callable[[], float],
) -> None:
    """The demo's traffic, once per group's model, into one log."""
    await asyncio.gather(
        *(
            drive(run.url, g.model, phases, log=traffic, seed=seed + i, stop=stop, clock=clock)
            for i, g in enumerate(run.groups)
        )
    )


def _summary(
    run: FleetRun, traffic: TrafficLog | None, window: tuple[float, float], console: Console
) -> Summary | None:
    if traffic is None:
        return None
    summary = summarize(
        traffic.results,
        run.timeline.between(*window),
        scale_outs=sum(1 for d in run.changes if d.delta > 0),
        scale_ins=sum(1 for d in run.changes if d.delta < 0),
        cut_by_scale_in=run.cut_requests,
        undrained=run.undrained,
    )
    console.print("\n[bold]summary[/bold]")
    for line in summary_lines(summary):
        console.print("  " + line, markup=False, highlight=False)
    return summary
