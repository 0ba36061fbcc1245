"""The gateway's background checks: /health probes move replicas through their states,
/metrics scrapes feed the fleet core the engines' own view of their load."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

import aiohttp

from gpufleet.fleet_state import LOAD_FROM_IN_FLIGHT, EngineIdentity, FleetState
from gpufleet.gateway import engine_probe, probe_reasons, probes
from gpufleet.gateway.cadence import Cadence
from gpufleet.gateway.config import GatewayConfig
from gpufleet.gateway.replicas import Replica
from gpufleet.routing.types import ReplicaState

log = logging.getLogger("gpufleet.gateway")


class HealthChecks:
    def __init__(
        self,
        config: GatewayConfig,
        fleet: FleetState[Replica],
        session: Callable[[], aiohttp.ClientSession | None],
    ) -> None:
        self.config = config
        self.fleet = fleet
        self._session = session
        self._probing: set[str] = set()
        # The scrape loop's clock and sleep (a test drives them; nothing else reads them),
        # and when its recent rounds were due and began: (due, began) on that clock.
        self.cadence_clock: Callable[[], float] = time.monotonic
        self.cadence_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self.scrape_cadence: Cadence | None = None
        self.scrape_rounds: deque[tuple[float, float]] = deque(maxlen=256)
        self._scrape_origin_s: float | None = None

    def align_scrapes(self, origin_s: float) -> None:
        """From the next round on, scrape at origin_s + k × scrape_interval_s (`gpufleet up`
        puts them `cadence.SCRAPE_AFTER_TICK_S` after the autoscaler's ticks)."""
        self._scrape_origin_s = origin_s
        if self.scrape_cadence is not None:
            self.scrape_cadence.rephase(origin_s, self.cadence_clock())

    async def probe_one(self, replica: Replica) -> None:
        session = self._session()
        if replica.replica_id in self._probing or session is None:
            return
        self._probing.add(replica.replica_id)
        table = self.fleet.table
        try:
            timeout_s = self.config.health.probe_timeout_s
            chunks_before = replica.rx_chunks
            result = await probe_reasons.probe(
                session, replica.url, timeout_s, models_probe=replica.uses_models_probe
            )
            now_s = time.monotonic()
            if result.uses_models_probe and not replica.uses_models_probe:
                replica.uses_models_probe = True
                log.info("replica %s has no /health: probing it through GET /v1/models",
                         replica.replica_id)  # fmt: skip
            if replica.state is ReplicaState.DRAINING:
                return
            if not result.ok:
                if result.timed_out and replica.rx_chunks != chunks_before:
                    return  # it streamed to us meanwhile: busy, not dead (or we are slow)
                was = replica.state
                if result.reason != replica.down_reason:
                    log.warning("replica %s (%s) %s: %s", replica.replica_id, replica.url,
                                was, result.reason)  # fmt: skip
                replica.down_reason = result.reason
                table.probe_failed(replica, now_s, definite=not result.timed_out)
                if replica.state is not was:
                    log.warning("replica %s %s -> %s: %s", replica.replica_id, was,
                                replica.state, result.reason)  # fmt: skip
                return
            replica.down_reason = ""
            if not table.probe_passed(replica, now_s):
                return
            if not replica.fixed_models:
                cards = result.model_cards
                if cards is None:
                    cards = await probes.fetch_models(session, replica.url, timeout_s)
                if cards is None:
                    replica.down_reason = "healthy, but GET /v1/models does not say what it serves"
                    return  # try next tick
                replica.model_cards = cards
                replica.models = frozenset(c["id"] for c in cards)
                self.fleet.adapters.learn(cards)  # its adapters: cards with a parent
            was = replica.state
            if table.mark_ready(replica):
                self.fleet.became_ready(replica, now_s)  # slow start, when on
                log.info("replica %s %s -> ready (%s)", replica.replica_id, was, result.reason)
        finally:
            self._probing.discard(replica.replica_id)

    async def probe_loop(self) -> None:
        interval_s = self.config.health.probe_interval_s
        while True:
            await asyncio.gather(*(self.probe_one(r) for r in self.fleet.table))
            await asyncio.sleep(interval_s)

    async def tick_loop(self) -> None:
        """Ejections run out and the success-rate detector runs (the table's clock)."""
        step_s = min(1.0, self.config.outlier.base_ejection_time_s / 4)
        while True:
            now_s = time.monotonic()
            self.fleet.table.tick(now_s)
            self.fleet.ramp(now_s)  # slow start's weights follow the replicas' age
            await asyncio.sleep(step_s)

    async def scrape_one(self, replica: Replica) -> None:
        session = self._session()
        assert session is not None
        if replica.engine == engine_probe.NO_METRICS_ENGINE:
            return  # configured as a plain OpenAI server: routed by in-flight counts
        timeout_s = self.config.health.probe_timeout_s
        scraped = await engine_probe.scrape(session, replica, timeout_s)
        if scraped is None:
            return
        if not scraped.load_reported and not replica.load_note:
            identity = EngineIdentity(replica.engine, "config")
            if replica.engine_source != "config":
                identity = await engine_probe.identify_engine(session, replica, scraped, timeout_s)
                if identity.engine and not replica.engine:
                    replica.engine, replica.engine_source = identity.engine, identity.source
            replica.load_note = engine_probe.no_load_note(identity)
        if self.fleet.apply_scrape(replica, scraped, time.monotonic()):
            if replica.load_signals == LOAD_FROM_IN_FLIGHT:
                log.warning("replica %s (%s): %s; routing it by in-flight counts alone",
                            replica.replica_id, replica.url, replica.load_note)  # fmt: skip
            else:
                log.info("replica %s: load and KV from its %s metrics", replica.replica_id,
                         replica.engine)  # fmt: skip

    async def scrape_loop(self) -> None:
        """Scrape every live replica at a fixed cadence (`cadence.Cadence`: round k at the
        loop's start + k × scrape_interval_s; a round that overruns skips the slots it
        passed, as Prometheus does), so that the scrapes keep one phase against the
        autoscaler's ticks, as the simulator places them."""
        clock, sleep = self.cadence_clock, self.cadence_sleep
        live = (ReplicaState.READY, ReplicaState.DRAINING)
        cadence = self.scrape_cadence = Cadence(self.config.scrape_interval_s, clock())
        if self._scrape_origin_s is not None:
            cadence.rephase(self._scrape_origin_s, clock())
        while True:
            self.scrape_rounds.append((cadence.due_s(), clock()))
            scraped = [r for r in self.fleet.table if r.state in live]
            await asyncio.gather(*(self.scrape_one(r) for r in scraped))
            due_s = cadence.advance(clock())
            await sleep(max(0.0, due_s - clock()))
