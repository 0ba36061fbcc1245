"""The gateway scrapes at a fixed cadence (wave 19): round k at the loop's start + k × the
interval, whatever the rounds took, and an overrun skips slots instead of bursting.

Real gateway, real sockets, a stub replica in-process; only the scrape loop's clock is a
test clock, which the stub moves forward on every GET /metrics (a scrape round "takes"
that long), so nothing here depends on how fast the machine is. The loop before wave 19
slept the interval after each round: its rounds began at 0, 1.3, 2.6, … here."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from gpufleet.gateway.cadence import Cadence
from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway

from .conftest import wait_until
from .stub_backend import StubBackend

pytestmark = pytest.mark.process


class ScrapeClock:
    """The scrape loop's clock: moves only when the loop sleeps or a scrape is served."""

    def __init__(self) -> None:
        self.now_s = 1000.0
        self.aligned_s = 0.0  # the origin a test aligned the scrapes to

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, s: float) -> None:
        self.now_s += s
        await asyncio.sleep(0.001)  # (real time, only so the test does not spin)


async def scrape_rounds(
    round_s: float, interval_s: float = 1.0, align_s: float | None = None
) -> list[tuple[float, float]]:
    """(due, began) of the first rounds that scraped a replica whose /metrics takes round_s
    (`align_s`: once the replica is ready, align the scrapes to that long after now)."""
    clock = ScrapeClock()
    stub = await StubBackend("s0").start()
    gw = Gateway(validate_config({
        "replicas": [{"url": stub.url}], "scrape_interval_s": interval_s,
        "health": {"probe_interval_s": 0.05, "probe_timeout_s": 5.0}}))  # fmt: skip
    gw.health.cadence_clock, gw.health.cadence_sleep = clock, clock.sleep

    def served() -> None:
        clock.now_s += round_s

    stub.on_metrics = served
    try:
        await gw.start("127.0.0.1", 0)
        if align_s is not None:
            await wait_until(lambda: stub.metrics_hits >= 1)
            clock.aligned_s = clock() + align_s
            gw.health.align_scrapes(clock.aligned_s)
            gw.health.scrape_rounds.clear()
            stub.metrics_hits = 0
        await wait_until(lambda: stub.metrics_hits >= 6)
    finally:
        await gw.stop()
        await stub.stop()
    rounds = list(gw.health.scrape_rounds)
    return [(clock.aligned_s, 0.0), *rounds] if align_s is not None else rounds


def slots(rounds: list[tuple[float, float]], interval_s: float = 1.0) -> list[float]:
    origin = rounds[0][0]
    return [(began - origin) / interval_s for _, began in rounds]


@pytest.mark.parametrize("round_s", [0.3, 0.7])
async def test_rounds_begin_on_their_slots_whatever_they_take(round_s: float) -> None:
    rounds = await scrape_rounds(round_s)
    at = slots(rounds)
    # Every round began exactly when it was due, on a whole slot of the interval.
    assert all(due == pytest.approx(began, abs=1e-9) for due, began in rounds)
    assert at == pytest.approx([round(x) for x in at], abs=1e-9)
    assert [round(x) for x in at] == list(range(len(at)))  # none skipped, none repeated


async def test_an_overrun_skips_to_the_next_slot_instead_of_bursting() -> None:
    rounds = await scrape_rounds(1.4)  # each scraping round overruns one slot
    at = slots(rounds)
    assert at == pytest.approx([round(x) for x in at], abs=1e-9)
    gaps = [b - a for a, b in itertools.pairwise(at)]
    assert all(g >= 1 - 1e-9 for g in gaps)  # never two rounds within one interval
    assert pytest.approx(max(gaps)) == 2  # a 1.4 s round: its next slot skipped


async def test_aligned_scrapes_keep_their_offset_from_the_origin_given() -> None:
    """`gpufleet up` aligns the scrapes half a tick after the autoscaler's first tick."""
    (origin, _), _first, *rounds = await scrape_rounds(0.3, align_s=0.25)
    # (the round under way, or due, when they were aligned kept its old start)
    at = [(began - origin) for _, began in rounds]
    assert at == pytest.approx([round(x) for x in at], abs=1e-9)
    assert all(due == pytest.approx(began, abs=1e-9) for due, began in rounds)
    assert len(rounds) >= 4


def test_cadence_slots() -> None:
    c = Cadence(interval_s=2.0, origin_s=10.0)
    assert c.due_s() == 10.0
    assert c.advance(10.5) == 12.0  # on time
    assert c.advance(12.0) == 14.0  # ended exactly as the next slot began: no skip
    assert (c.slot, c.skipped) == (2, 0)
    assert c.advance(19.1) == 20.0  # overran slots 3 and 4 (due 16, 18): skipped
    assert (c.slot, c.skipped) == (5, 2)
    assert c.advance(20.0) == 22.0
    assert c.due_s(0) == 10.0
    c.rephase(origin_s=20.25, now_s=21.0)  # from the next round on: 22.25, 24.25, …
    assert c.advance(21.3) == 22.25
    assert c.advance(22.5) == 24.25
