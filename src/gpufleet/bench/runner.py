"""The load generator: arrivals in, streamed requests out, a `BenchReport` at the end.

`run_benchmark(config)` is the programmatic API the CLI and other benchmarks use. It
owns one aiohttp session whose connector is sized for the concurrency, scrapes the
target's /metrics before and after, and measures its own overhead while it runs.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Iterator, Sized
from time import perf_counter
from typing import Any

import aiohttp

from gpufleet.bench.client import stream_request
from gpufleet.bench.config import DEFAULT_NUM_REQUESTS, TIMED_RUN_MAX_REQUESTS, BenchConfig
from gpufleet.bench.metrics import request_metrics, summarize
from gpufleet.bench.overhead import LoopLagMonitor
from gpufleet.bench.records import RequestRecord
from gpufleet.bench.report import BenchReport
from gpufleet.bench.requests import ENDPOINT_PATHS, ConversationHistory
from gpufleet.bench.scrape import SeriesKey, counter_deltas, parse_counters
from gpufleet.errors import UserError
from gpufleet.workload import (
    Conversation,
    PromptFactory,
    WorkloadSpec,
    read_trace,
    synthetic_shapes,
    text_conversations,
    trace_shapes,
)
from gpufleet.workload.shapes import arrivals, spec_from_flags

# Gaps shorter than this are slept plainly (stop is checked after); longer ones wake on stop.
STOP_POLL_S = 0.05

# (requests done, of which failed, total requests or None when the run is timed)
ProgressFn = Callable[[int, int, int | None], None]


def base_url(url: str) -> str:
    """The server root: 'http://h:8000/v1/' -> 'http://h:8000'."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def planned_requests(config: BenchConfig) -> int | None:
    """Requests the run will send, or None when it is bounded by time only."""
    if config.sessions is not None:
        total = config.sessions * config.turns
        return min(total, config.num_requests) if config.num_requests else total
    if config.num_requests is not None:
        return config.num_requests
    if config.duration_s is not None:
        return None
    return DEFAULT_NUM_REQUESTS


def workload_spec(config: BenchConfig) -> WorkloadSpec:
    """The synthetic workload of `config` in the shared workload model (as `gpufleet sim`)."""
    planned = planned_requests(config)
    conversations = config.sessions if config.sessions is not None else planned
    return spec_from_flags(config, conversations=conversations, rate=config.rate, ramp=config.ramp)


def build_conversations(
    config: BenchConfig, factory: PromptFactory | None = None
) -> tuple[Iterator[Conversation], int | None]:
    """The workload of `config` as text (lazy), with arrival times, and its request count
    (None if only time-bounded)."""
    if not config.trace:
        shapes = synthetic_shapes(workload_spec(config))
        return text_conversations(shapes, factory), planned_requests(config)
    records = read_trace(config.trace, limit=config.num_requests, fmt=config.trace_format)
    if config.duration_s is not None:
        horizon = config.duration_s * config.speedup
        records = [r for r in records if r.arrival_s < horizon]
    if not records:
        raise UserError(
            "the trace has no request inside the run",
            field="--trace",
            fix="raise --duration or --num-requests",
        )
    shapes = trace_shapes(records, speedup=config.speedup, seed=config.seed)
    return text_conversations(shapes, factory), len(records)


async def resolve_model(session: aiohttp.ClientSession, root: str, headers: dict[str, str]) -> str:
    """The first model the server lists at /v1/models (as vLLM's benchmark does)."""
    try:
        async with session.get(f"{root}/v1/models", headers=headers) as resp:
            data = await resp.json(content_type=None)
            return str(data["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as e:
        raise UserError(
            f"could not read the model from {root}/v1/models ({type(e).__name__}: {e})",
            field="--model",
            fix="pass --model NAME, and check that --url points at a running server",
        ) from None


async def scrape_counters(
    session: aiohttp.ClientSession, root: str, headers: dict[str, str]
) -> tuple[dict[SeriesKey, float] | None, str]:
    try:
        async with session.get(
            f"{root}/metrics", headers=headers, timeout=aiohttp.ClientTimeout(total=10)
        ) as resp:
            if resp.status != 200:
                return None, f"/metrics answered {resp.status}"
            return parse_counters(await resp.text()), ""
    except (aiohttp.ClientError, TimeoutError) as e:
        return None, f"/metrics unreachable: {type(e).__name__}"
    except ValueError as e:
        return None, f"/metrics not in Prometheus text format: {e}"


async def warm_up(
    session: aiohttp.ClientSession,
    config: BenchConfig,
    url: str,
    headers: dict[str, str],
    model: str,
) -> None:
    """Send `config.warmup_requests` requests of the run's size and discard them.

    Their prompts are unique (their own seed), so they warm connections and the server
    without pre-filling the prefix cache with the measured prompts.
    """
    spec = WorkloadSpec(
        conversations=config.warmup_requests,
        input_tokens=max(1, config.input_tokens),
        output_tokens=config.output_tokens,
        seed=config.seed + 1_000_003,
    )
    convs = text_conversations(synthetic_shapes(spec))
    width = max(1, min(config.warmup_requests, config.concurrency or config.max_concurrency or 8))
    sem = asyncio.Semaphore(width)

    async def one(conv: Conversation) -> None:
        history = ConversationHistory(config.endpoint, model, ignore_eos=config.ignore_eos)
        body, _ = history.request(conv.turns[0])
        async with sem:
            await stream_request(session, url, body, headers, RequestRecord())

    await asyncio.gather(*(one(c) for c in convs))


async def scrape_all(
    session: aiohttp.ClientSession, roots: list[str], headers: dict[str, str]
) -> tuple[dict[SeriesKey, float] | None, str]:
    """Counters of every root; with more than one, each series gains a `target` label.

    None only when no root answered; the note names the ones that did not.
    """
    merged: dict[SeriesKey, float] = {}
    notes: list[str] = []
    answered = 0
    for root in roots:
        counters, note = await scrape_counters(session, root, headers)
        if counters is None:
            notes.append(f"{root}: {note}" if len(roots) > 1 else note)
            continue
        answered += 1
        for (name, labels), value in counters.items():
            if len(roots) > 1:
                labels = tuple(sorted((*labels, ("target", root))))
            merged[(name, labels)] = value
    return (merged if answered else None), "; ".join(notes)


class _Run:
    """The state of one run: the budget, the records, the concurrency cap."""

    def __init__(
        self,
        config: BenchConfig,
        session: aiohttp.ClientSession,
        url: str,
        headers: dict[str, str],
        model: str,
        planned: int | None,
        on_progress: ProgressFn | None,
        stop: asyncio.Event,
    ):
        self.config = config
        self.stop = stop
        self.session = session
        self.url = url
        self.headers = headers
        self.model = model
        self.budget = planned if planned is not None else TIMED_RUN_MAX_REQUESTS
        self.planned = planned
        self.sent = 0
        self.records: list[RequestRecord] = []
        self.failed = 0
        self.on_progress = on_progress
        cap = config.max_concurrency if not config.closed_loop else None
        self.sem = asyncio.Semaphore(cap) if cap else None
        self.t0 = 0.0
        self.deadline = math.inf

    def may_send(self) -> bool:
        return self.sent < self.budget and perf_counter() < self.deadline and not self.stop.is_set()

    async def _sleep_or_stop(self, delay_s: float) -> bool:
        """Sleep `delay_s`; True if the run was stopped meanwhile."""
        if delay_s < STOP_POLL_S:  # a plain sleep is cheaper; stop is seen right after
            await asyncio.sleep(delay_s)
            return self.stop.is_set()
        try:
            await asyncio.wait_for(self.stop.wait(), delay_s)
        except TimeoutError:
            return False
        return True

    async def _finish(self, tasks: set[asyncio.Task[None]]) -> None:
        """Wait for the work in flight; once the run is stopped, cancel what is left
        (a cancelled request leaves no record: it is neither a success nor a failure)."""
        stopper = asyncio.create_task(self.stop.wait())
        try:
            while tasks and not self.stop.is_set():
                await asyncio.wait({*tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def conversation(self, conv: Conversation, scheduled_s: float) -> None:
        history = ConversationHistory(
            self.config.endpoint,
            self.model,
            ignore_eos=self.config.ignore_eos,
            extra=self.config.extra_body or None,
        )
        for t, turn in enumerate(conv.turns):
            if t > 0:
                # The dispatcher admitted (and counted) the first turn; later ones need
                # budget and time of their own.
                if not self.may_send():
                    return
                self.sent += 1
                scheduled_s = perf_counter()
            body, prompt_tokens = history.request(turn)
            rec = RequestRecord(
                conversation_id=conv.id,
                turn=t,
                scheduled_s=scheduled_s,
                prompt_tokens=prompt_tokens,
                max_tokens=turn.output_tokens,
            )
            if self.sem is not None:
                async with self.sem:
                    await stream_request(self.session, self.url, body, self.headers, rec)
            else:
                await stream_request(self.session, self.url, body, self.headers, rec)
            self.records.append(rec)
            self.failed += not rec.ok
            if self.on_progress is not None:
                self.on_progress(len(self.records), self.failed, self.planned)
            if not rec.ok:
                return  # no answer to carry into the next turn
            history.add_answer(rec.text)
            if rec.usage_completion_tokens:
                rec.text = ""  # counted by the server; keeps long runs small in memory

    async def open_loop(self, convs: Iterator[Conversation], offsets: Iterator[float]) -> None:
        tasks: set[asyncio.Task[None]] = set()
        for conv in convs:
            offset = conv.arrival_s if conv.arrival_s is not None else next(offsets)
            due = self.t0 + offset
            if due >= self.deadline or not self.may_send():
                break
            delay = due - perf_counter()
            if delay > 0 and await self._sleep_or_stop(delay):
                break
            self.sent += 1
            task = asyncio.create_task(self.conversation(conv, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await self._finish(tasks)

    async def closed_loop(self, convs: Iterator[Conversation], workers: int) -> None:
        async def worker() -> None:
            while self.may_send():
                conv = next(convs, None)
                if conv is None:
                    return
                self.sent += 1
                await self.conversation(conv, perf_counter())

        tasks = {asyncio.create_task(worker()) for _ in range(workers)}
        for task in tasks:
            task.add_done_callback(tasks.discard)
        await self._finish(tasks)


def _offsets(config: BenchConfig, n_conversations: int | None) -> Iterator[float]:
    """Arrival times for conversations handed in without their own (`conversations=`)."""
    n = n_conversations
    if n is not None and n > TIMED_RUN_MAX_REQUESTS:
        n = None  # too many to draw up front: unbounded, not rescaled
    ramp = config.ramp if n is not None else None  # a ramp spans a known count
    spec = WorkloadSpec(n, config.rate, config.burstiness, ramp, seed=config.seed)
    return arrivals(spec)


async def run_benchmark(
    config: BenchConfig,
    *,
    on_progress: ProgressFn | None = None,
    conversations: Iterable[Conversation] | None = None,
    stop: asyncio.Event | None = None,
) -> BenchReport:
    """Run one benchmark. `conversations` replaces the workload the config describes.

    Setting `stop` ends the run early: nothing more is sent, requests in flight are
    cancelled, and the report covers the requests that finished (`report.interrupted`).
    """
    stop = stop or asyncio.Event()
    config.validate()
    n_convs: int | None = None  # conversations the arrival process spreads (None: unbounded)
    if conversations is not None:
        planned = config.num_requests
        if isinstance(conversations, Sized):
            n_convs = len(conversations)
            total = sum(c.num_requests for c in conversations)
            planned = min(planned, total) if planned is not None else total
        convs: Iterator[Conversation] = iter(conversations)
    else:
        convs, planned = build_conversations(config)  # each carries its arrival time
    root = base_url(config.url)
    url = root + ENDPOINT_PATHS[config.endpoint]
    headers = {"Content-Type": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    width = config.concurrency or config.max_concurrency or 0  # 0: no limit (open loop)
    connector = aiohttp.TCPConnector(limit=width, limit_per_host=width, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=config.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = config.model or await resolve_model(session, root, headers)
        if config.warmup_requests:
            await warm_up(session, config, url, headers, model)
        before, note = (None, "scraping disabled")
        scrape_roots = [root, *(base_url(u) for u in config.extra_metrics_urls)]
        if config.scrape_metrics:
            before, note = await scrape_all(session, scrape_roots, headers)
        run = _Run(config, session, url, headers, model, planned, on_progress, stop)
        monitor = LoopLagMonitor()
        monitor.start()
        run.t0 = perf_counter()
        if config.duration_s is not None:
            run.deadline = run.t0 + config.duration_s
        try:
            if config.closed_loop:
                assert config.concurrency is not None
                await run.closed_loop(convs, config.concurrency)
            else:
                # Conversations handed in may lack arrival times; built ones carry theirs.
                given = conversations is not None
                await run.open_loop(convs, _offsets(config, n_convs) if given else iter(()))
        finally:
            duration_s = perf_counter() - run.t0
            await monitor.stop()
        after = None
        if before is not None:
            after, note = await scrape_all(session, scrape_roots, headers)
    if not run.records:
        if stop.is_set():
            raise UserError("stopped before any request finished", fix="let the run go longer")
        raise UserError(
            "no request was sent", field="--num-requests", fix="raise --num-requests or --duration"
        )
    metrics = summarize(
        run.records,
        duration_s,
        goodput_slo_ms=config.goodput_slo_ms,
        percentiles=config.percentiles,
    )
    per_request = [m for m in map(request_metrics, run.records) if m is not None]
    uncapped = not config.closed_loop and config.max_concurrency is None
    schedule_lags = (
        [r.start_s - r.scheduled_s for r in run.records if r.turn == 0] if uncapped else None
    )
    cfg: dict[str, Any] = config.to_dict()
    cfg["model"] = model
    return BenchReport(
        config=cfg,
        metrics=metrics,
        client=monitor.report(schedule_lags),
        server=counter_deltas(before, after) if before is not None and after is not None else None,
        server_note=note,
        ttfts_s=[m.ttft_s for m in per_request],
        tpots_s=[m.tpot_s for m in per_request if m.tpot_s is not None],
        e2els_s=[m.e2e_s for m in per_request],
        interrupted=stop.is_set(),
    )
