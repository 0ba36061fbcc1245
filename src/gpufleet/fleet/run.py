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
import hmac
import itertools
import json
import logging
import math
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from rich.console import Console
from rich.live import Live

from gpufleet.autoscale.actuator import FleetActuator
from gpufleet.autoscale.controller import Controller
from gpufleet.autoscale.decision import ScalingDecision
from gpufleet.autoscale.gateway_link import InProcessGateway
from gpufleet.autoscale.local import LocalProcessActuator
from gpufleet.autoscale.metrics import AutoscaleCollector
from gpufleet.autoscale.policies import make_policy
from gpufleet.fleet.config import FleetConfig
from gpufleet.fleet.replica_latency import ReplicaTtft, scrape_ttft
from gpufleet.fleet.summary import ReplicaTimeline, Summary, summarize, summary_lines
from gpufleet.fleet.traffic import DEMO_PHASES, TrafficLog, drive
from gpufleet.fleet.view import Snapshot, render
from gpufleet.plan.capacity import ReplicaCapacity
from gpufleet.routing.types import ReplicaState
from gpufleet.workload import RatePhase, phase_at, total_duration_s

log = logging.getLogger("gpufleet.up")


@dataclass(slots=True)
class FleetRun:
    """Everything one `up` holds while it runs (for the view, tests and the summary)."""

    config: FleetConfig
    gateway: Any
    actuator: FleetActuator
    controller: Controller
    url: str
    started_s: float
    timeline: ReplicaTimeline = field(default_factory=ReplicaTimeline)
    ttft: ReplicaTtft = field(default_factory=ReplicaTtft)

    @property
    def changes(self) -> list[ScalingDecision]:
        return list(self.controller.changes)

    @property
    def cut_requests(self) -> int:
        return self.actuator.cut_requests_total

    def holding(self) -> int:
        """Replicas holding a GPU right now (starting, ready or draining)."""
        return sum(1 for m in self.actuator.list() if m.state != ReplicaState.DEAD)


def _build_gateway(cfg: FleetConfig, port: int | None, host: str | None) -> Any:
    try:
        from gpufleet.gateway.config import validate_config
        from gpufleet.gateway.server import Gateway
    except ImportError as e:  # the gateway is part of this package; say what is missing
        raise RuntimeError(f"gpufleet.gateway is not available: {e}") from e
    settings = cfg.gateway_settings()
    if port is not None:
        settings["port"] = port
    if host is not None:
        settings["host"] = host
    return Gateway(validate_config(settings, source="gateway"))


def _admin_route(gateway: Any, controller: Controller, capacity: ReplicaCapacity | None) -> None:
    key = getattr(gateway.config, "admin_key", None)

    async def autoscale(request: web.Request) -> web.Response:
        if key:
            auth = request.headers.get("Authorization", "")
            if not hmac.compare_digest(auth.encode(), f"Bearer {key}".encode()):
                return web.json_response(
                    {
                        "error": {
                            "message": "missing or wrong admin key (Authorization: Bearer ...)",
                            "type": "authentication_error",
                            "param": None,
                            "code": 401,
                        }
                    },
                    status=401,
                )
        body = controller.to_json()
        body["capacity_per_replica"] = capacity.to_json() if capacity is not None else None
        return web.json_response(body, dumps=lambda o: json.dumps(o, default=str))

    gateway.app.router.add_get("/admin/autoscale", autoscale)


@contextlib.asynccontextmanager
async def _actuator(
    cfg: FleetConfig, link: InProcessGateway, log_dir: Path, clock: Callable[[], float]
) -> AsyncIterator[FleetActuator]:
    """The backend's actuator (local processes or Ray), closed (all replicas stopped) on exit."""
    rs, be = cfg.replicas, cfg.backend
    common: dict[str, Any] = {
        "values": rs.values(),
        "registry": link,
        "expected_startup_s": rs.expected_startup_s or rs.startup_s + 2.0,
        "health_timeout_s": rs.health_timeout_s,
        "drain_deadline_s": rs.drain_deadline_s,
        "restart_crashed": rs.restart_crashed,
        "log_dir": log_dir,
        "clock": clock,
    }
    if be.kind == "ray":
        from gpufleet.autoscale.raycluster import ReplicaShape, ray_actuator

        shape = ReplicaShape(
            tp=rs.tp,
            pp=rs.pp,
            cpus_per_bundle=be.cpus_per_bundle,
            memory_bytes_per_bundle=(
                int(be.memory_gb_per_bundle * (1 << 30)) if be.memory_gb_per_bundle else None
            ),
            resources_per_bundle=be.resources_per_bundle,
        )
        async with ray_actuator(
            rs.full_command(),
            address=be.address,
            namespace=be.namespace,
            fleet=be.fleet_name,
            shape=shape,
            local_gpus=be.local_gpus
            if be.local_gpus is not None
            else cfg.autoscale.max_replicas * shape.gpus,
            local_cpus=math.ceil(cfg.autoscale.max_replicas * rs.pp * be.cpus_per_bundle) + 1,
            probe_interval_s=be.probe_interval_s,
            probe_failures=be.probe_failures,
            **common,
        ) as ray_act:
            yield ray_act
        return
    local = LocalProcessActuator(rs.full_command(), host="127.0.0.1", **common)
    try:
        yield local
    finally:
        await local.close()


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
    link = InProcessGateway(gateway)
    if log_dir is None and cfg.log_dir:
        log_dir = Path(cfg.log_dir)
    tmp = None
    if log_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpufleet-up-")
        log_dir = Path(tmp.name)
    policy = make_policy(cfg.autoscale.policy, cfg.autoscale.bounds(), cfg.policy_params())
    controller: Controller | None = None
    run: FleetRun | None = None
    sampler: asyncio.Task[None] | None = None
    stack = contextlib.AsyncExitStack()
    try:
        actuator = await stack.enter_async_context(_actuator(cfg, link, log_dir, clock))
        controller = Controller(
            policy, actuator, link.read_signals, interval_s=cfg.autoscale.interval_s, clock=clock
        )
        _admin_route(gateway, controller, cfg.capacity())
        # One scrape of the gateway shows the fleet's size and decisions beside its traffic.
        gateway.metrics.registry.register(AutoscaleCollector(controller))
        bound = await gateway.start()
        url = f"http://{gateway.host}:{bound}"
        run = FleetRun(cfg, gateway, actuator, controller, url, clock())
        # Replicas adopted from a previous controller (Ray) count towards the first ones.
        missing = cfg.autoscale.first_count() - len(actuator.list())
        if missing > 0:
            await actuator.start(missing)
        if cfg.autoscale.enabled:
            controller.start()
        sampler = asyncio.get_running_loop().create_task(_sample(run, clock))
        yield run
    finally:
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        if controller is not None:
            await controller.stop()
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
                    for m in run.actuator.list()
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
        cap = cfg.capacity()
        if cap is not None:
            console.print(
                f"{cfg.autoscale.policy} policy: capacity_per_replica {cap.sequences} "
                f"({cap.describe()})",
                markup=False,
                highlight=False,
            )
        traffic: TrafficLog | None = None
        driver: asyncio.Task[TrafficLog] | None = None
        if demo:
            # Traffic starts on a warm fleet: the show is scaling, not the first cold start.
            console.print(
                f"waiting for the first replica (cold start ≈ {cfg.replicas.startup_s:g} s)…"
            )
            while not stop.is_set() and not any(
                m.state == ReplicaState.READY for m in run.actuator.list()
            ):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
        t0 = clock()
        if demo and not stop.is_set():
            traffic = TrafficLog()
            driver = asyncio.get_running_loop().create_task(
                drive(
                    run.url,
                    cfg.replicas.model,
                    phases,
                    log=traffic,
                    seed=seed,
                    stop=stop,
                    clock=clock,
                )
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
    )
    console.print("\n[bold]summary[/bold]")
    for line in summary_lines(summary):
        console.print("  " + line, markup=False, highlight=False)
    return summary
