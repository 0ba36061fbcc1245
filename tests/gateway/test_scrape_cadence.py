"""The gateway scrapes at a fixed cadence (wave 19): round k at the loop's start + k × the
interval, whatever the rounds took, and an overrun skips slots instead of bursting.

Real gateway, real sockets, a stub replica in-process; only the scrape loop's clock is a
test clock, which the stub moves forward on every GET /metrics (a scrape round "takes"
that long), so nothing here depends on how fast the machine is. The loop before wave 19
slept the interval after each round: its rounds began at 0, 1.3, 2.6, … here."""

from __future__ import annotations

import asyncio

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

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, s: float) -> None:
        self.now_s += s
        await asyncio.sleep(0.001)  # (real time, only so the test does not spin)


async def scrape_rounds(round_s: float, interval_s: float = 1.0) -> list[tuple[float, float]]:
    """(due, began) of the first rounds that scraped a replica whose /metrics takes round_s."""
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
        await wait_until(lambda: stub.metrics_hits >= 6)
    finally:
        await gw.stop()
        await stub.stop()
    return list(gw.health.scrape_rounds)


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
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert all(g >= 1 - 1e-9 for g in gaps)  # never two rounds within one interval
    assert 2 == pytest.approx(max(gaps))  # a 1.4 s round: its next slot skipped


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
