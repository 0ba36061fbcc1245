"""The discrete-event fleet simulator: engines, router and autoscaler on a virtual clock.

Events live in one heap ordered by (time, kind, sequence): a request arrives; a replica's
engine step ends; a replica finishes its cold start; the gateway scrapes /metrics; the
autoscaler ticks; a queued request times out. Everything else is the live system's own
objects driven the way the live drivers drive them:

- each replica is an `Engine` stepped as `gpufleet.replica.runner` steps it: `step()` at
  the step's start, its tokens handed out at the step's end, the next step scheduled then;
- routing is a `RoutingPolicy` from `gpufleet.routing.make_policy`, fed `RequestInfo` and
  `ReplicaView`s kept as the gateway keeps them (in-flight counts, `EngineStats` scraped
  every `scrape_interval_s` with `in_flight_at_scrape`, start / first token / finish
  notifications); a request with no ready replica waits in the gateway queue;
- autoscaling is a `ScalingPolicy` whose `FleetSignals` come from the gateway's signal
  dict through `gpufleet.autoscale.gateway_link.fleet_signals`, with TTFT / TPOT
  percentiles from the gateway's `RecentWindow`; scale-in picks replicas with the
  controller's `scale_in_order`; new replicas become ready after `startup_s`; drained
  ones stop when their last request ends (or are cut at the drain deadline).

Pure: no wall clock, no sleep, no I/O; a seed fixes the run.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.autoscale.controller import scale_in_order
from gpufleet.autoscale.decision import ScalingDecision, ScalingPolicy
from gpufleet.autoscale.gateway_link import fleet_signals
from gpufleet.engine import Engine, EngineConfig, EngineRequest
from gpufleet.gateway.metrics import RecentWindow
from gpufleet.gateway.policies import policy_needs_prefix
from gpufleet.gateway.signals import gateway_signals, latency_signals
from gpufleet.perf.step_time import StepTimeModel
from gpufleet.routing.prefix import DEFAULT_BYTES_PER_TOKEN, ROUTING_BLOCK_BYTES
from gpufleet.routing.types import (
    EngineStats,
    ReplicaState,
    ReplicaView,
    RequestInfo,
    RoutingPolicy,
)
from gpufleet.sim.replica import SimReplica
from gpufleet.tokenizer import block_hashes
from gpufleet.workload import SegmentHasher, SimRequest, placeholder_token_ids

# At equal times: hand out a step's tokens first, then new replicas, scrapes, arrivals,
# idle engines waking for them (so requests arriving at one instant share a first step, as
# the live runner wakes only after the submitting handlers yield), the autoscaler (which
# then sees this instant's arrivals), and timeouts last.
(
    STEP_DONE,
    REPLICA_READY,
    SCRAPE,
    ARRIVAL,
    WAKE,
    TICK,
    QUEUE_TIMEOUT,
    DRAIN_DEADLINE,
    RETRY,
) = range(9)

# The live gateway hashes 256-byte blocks of prompt text; at its nominal 4 bytes per token
# that is a routing block of 64 tokens, the unit prefix_aware sizes its index in.
ROUTING_BLOCK_TOKENS = int(ROUTING_BLOCK_BYTES / DEFAULT_BYTES_PER_TOKEN)
# The live runner sleeps 1 ms when the engine has work but nothing schedulable.
_IDLE_RETRY_S = 0.001


@dataclass(frozen=True, slots=True)
class AutoscaleSpec:
    policy: ScalingPolicy
    interval_s: float = 1.0
    startup_s: float = 30.0
    drain_deadline_s: float = 60.0


@dataclass(frozen=True)
class SimConfig:
    engine: EngineConfig
    step_time_model: StepTimeModel
    model: str = "model"
    replicas: int = 1  # the fixed fleet, or the initial one when autoscaling
    autoscale: AutoscaleSpec | None = None
    scrape_interval_s: float = 1.0  # gateway: scrape_interval_s
    signals_window_s: float = 60.0  # gateway: signals_window_s
    queue_timeout_s: float = 60.0  # gateway: queue.timeout_s
    closed_loop_clients: int | None = None  # None: open loop at the requests' arrival times
    tail_s: float = 0.0  # keep the autoscaler ticking this long after the last request
    routing_block_tokens: int = ROUTING_BLOCK_TOKENS
    seed: int = 0
    max_events: int = 200_000_000  # a hang guard, far above any real run


@dataclass(slots=True)
class RequestResult:
    """What a client saw of one request (times in seconds of virtual time)."""

    index: int
    arrival_s: float
    input_tokens: int
    output_tokens: int  # generated
    replica_id: str | None = None
    dispatched_s: float | None = None  # left the gateway queue for a replica
    first_token_s: float | None = None
    finished_s: float | None = None
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    error: str | None = None  # None: completed

    @property
    def ok(self) -> bool:
        return self.error is None and self.finished_s is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """vLLM's definition: (E2E - TTFT) / (output tokens - 1), for > 1 token."""
        if not self.ok or self.output_tokens <= 1 or self.first_token_s is None:
            return None
        assert self.finished_s is not None
        return (self.finished_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class ReplicaRecord:
    replica_id: str
    started_s: float
    ready_s: float | None
    stopped_s: float | None
    lifetime_s: float
    requests: int
    mean_in_flight: float
    peak_in_flight: int
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    preemptions: int
    steps: int


@dataclass(slots=True)
class SimResult:
    requests: list[RequestResult]
    replicas: list[ReplicaRecord]
    decisions: list[ScalingDecision]  # every tick
    end_s: float
    events: int
    wall_s: float
    cpu_s: float = 0.0  # this process's CPU time (the machine may be shared)
    fleet_size: list[tuple[float, int, int]] = field(default_factory=list)  # (t, ready, total)

    @property
    def scaling_changes(self) -> list[ScalingDecision]:
        return [d for d in self.decisions if d.delta != 0]


@dataclass(slots=True)
class _Live:
    req: SimRequest
    info: RequestInfo
    result: RequestResult
    replica: SimReplica | None = None
    engine_req: EngineRequest | None = None


class FleetSimulator:
    """Replays `requests` over a fleet. Pass the policy objects to use (the same classes
    the gateway and controller use); `run()` returns a `SimResult`."""

    def __init__(
        self,
        config: SimConfig,
        requests: Sequence[SimRequest],
        routing: RoutingPolicy,
        *,
        needs_prefix: bool | None = None,
    ) -> None:
        if config.replicas < 0:
            raise ValueError("replicas must be >= 0")
        if config.autoscale is None and config.replicas < 1:
            raise ValueError("a fixed fleet needs at least one replica")
        self.config = config
        self.requests = list(requests)
        self.routing = routing
        if needs_prefix is None:  # hash prompts only for policies that read them, as live
            needs_prefix = policy_needs_prefix(routing)
        self.needs_prefix = needs_prefix
        eng = config.engine
        self._engine_hasher = SegmentHasher(eng.block_size) if eng.enable_prefix_caching else None
        self._routing_hasher = SegmentHasher(config.routing_block_tokens)
        self.replicas: dict[str, SimReplica] = {}
        self._ready: list[ReplicaView] = []
        self._next_replica = 0
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.now_s = 0.0
        self._live: dict[str, _Live] = {}
        self._queue: deque[_Live] = deque()
        self._results: list[RequestResult] = []
        self._ttft_window = RecentWindow(config.signals_window_s)
        self._tpot_window = RecentWindow(config.signals_window_s)
        self._decisions: list[ScalingDecision] = []
        self._cold_starts_s: deque[float] = deque(maxlen=8)
        self._arrivals_left = 0
        self._next_request = 0  # closed loop: next request to hand a client
        self._fleet_size: list[tuple[float, int, int]] = []
        self._turn_tokens: dict[int, tuple[list[int], list[int]]] = {}
        # Multi-turn sessions: request index -> the next turn, sent when it ends.
        self._followers: dict[int, int] = {
            r.after: r.index for r in self.requests if r.after is not None
        }

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, payload))

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        cpu0 = time.process_time()
        cfg = self.config
        for _ in range(cfg.replicas):  # the initial fleet is already warm at t = 0
            self._start_replica(0.0, startup_s=0.0)
        self._record_fleet()
        if cfg.closed_loop_clients:
            if self._followers:
                raise ValueError("closed-loop clients cannot replay multi-turn sessions")
            n = min(cfg.closed_loop_clients, len(self.requests))
            for _ in range(n):
                self._push(0.0, ARRIVAL, self._next_request)
                self._next_request += 1
            self._arrivals_left = len(self.requests)
        else:
            for r in self.requests:
                if r.after is None:
                    self._push(r.arrival_s, ARRIVAL, r.index)
            self._arrivals_left = len(self.requests)
        self._push(cfg.scrape_interval_s, SCRAPE)
        if cfg.autoscale is not None:
            self._push(0.0, TICK)
        handlers: dict[int, Callable[[Any], None]] = {
            STEP_DONE: self._on_step_done,
            REPLICA_READY: self._on_ready,
            SCRAPE: self._on_scrape,
            ARRIVAL: self._on_arrival,
            TICK: self._on_tick,
            QUEUE_TIMEOUT: self._on_queue_timeout,
            DRAIN_DEADLINE: self._on_drain_deadline,
            RETRY: self._on_retry,
            WAKE: self._on_wake,
        }
        events = self._events
        pop = heapq.heappop
        on_step_done = self._on_step_done
        max_events = cfg.max_events
        count = 0
        last_work_s = 0.0
        while events:
            t, kind, _, payload = pop(events)
            count += 1
            if count >= max_events:
                raise RuntimeError(f"simulation exceeded {max_events} events")
            if kind == STEP_DONE:  # the bulk of all events: the shortest path
                self.now_s = last_work_s = t
                on_step_done(payload)
                continue
            if kind in (SCRAPE, TICK):
                if self._finished() and t > last_work_s + cfg.tail_s:
                    count -= 1
                    continue  # nothing left to serve: let the periodic events lapse
            else:
                last_work_s = t
            self.now_s = t
            handlers[kind](payload)
        end_s = self.now_s
        return SimResult(
            requests=sorted(self._results, key=lambda r: r.index),
            replicas=[self._replica_record(r, end_s) for r in self.replicas.values()],
            decisions=self._decisions,
            end_s=end_s,
            events=count,
            wall_s=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
            fleet_size=self._fleet_size,
        )

    def _finished(self) -> bool:
        return self._arrivals_left == 0 and not self._live and not self._queue

    # ------------------------------------------------------------------ requests
    def _on_arrival(self, index: int) -> None:
        req = self.requests[index]
        now = self.now_s
        self._arrivals_left -= 1
        result = RequestResult(
            index=index, arrival_s=now, input_tokens=req.input_tokens, output_tokens=0
        )
        hashes: tuple[int, ...] = ()
        if self.needs_prefix:
            hashes = tuple(self._routing_hasher.hashes(req.segments))
        info = RequestInfo(
            request_id=f"sim-{index}",
            model=self.config.model,
            prompt_tokens=0,  # the live gateway does not tokenize either
            session_key=req.session_key,
            prefix_hashes=hashes,
        )
        live = _Live(req, info, result)
        max_len = self.config.engine.max_model_len
        if req.input_tokens + req.output_tokens > max_len:
            # The replica refuses it with a 400, as vLLM does.
            self._fail(live, "context_length_exceeded")
            return
        self._live[info.request_id] = live
        if self._ready:
            self._dispatch(live)
        else:
            self._queue.append(live)
            self._push(now + self.config.queue_timeout_s, QUEUE_TIMEOUT, live)

    def _dispatch(self, live: _Live) -> None:
        now = self.now_s
        chosen = self.routing.choose(live.info, self._ready)
        if chosen is None:
            raise RuntimeError("routing policy chose nothing with replicas ready")
        replica = self.replicas[chosen.replica_id]
        replica.change_in_flight(now, +1)
        replica.requests_routed += 1
        self.routing.on_started(live.info, chosen)
        req = live.req
        tokens, block_hashes = self._engine_prompt(req)
        ereq = EngineRequest(
            live.info.request_id,
            tokens,
            req.output_tokens,
            seed=self.config.seed * 1_000_003 + req.index,
            prompt_block_hashes=block_hashes,
            arrival_s=now,
        )
        live.replica = replica
        live.engine_req = ereq
        live.result.replica_id = replica.replica_id
        live.result.dispatched_s = now
        replica.live_ids.add(live.info.request_id)
        engine = replica.engine
        if not engine.has_work:
            engine.advance_to(now)
        engine.add(ereq)
        if not replica.stepping:
            replica.stepping = True  # woken below, once this instant's arrivals are in
            self._push(now, WAKE, replica)

    def _engine_prompt(self, req: SimRequest) -> tuple[list[int], list[int] | None]:
        """Token ids and engine block hashes of a prompt. A session's next turn starts with
        the previous turn's own tokens (its prompt and the answer the engine generated), so
        the engine finds the answer's cached blocks as a live replica would."""
        prev = self._turn_tokens.pop(req.after, None) if req.after is not None else None
        hasher = self._engine_hasher
        if prev is None:
            hashes = hasher.hashes(req.segments) if hasher is not None else None
            return placeholder_token_ids(req.input_tokens), hashes
        prev_tokens, prev_hashes = prev
        tokens = prev_tokens + placeholder_token_ids(req.input_tokens - len(prev_tokens))
        if hasher is None:
            return tokens, None
        bs = hasher.block_tokens
        k = min(len(prev_hashes), len(prev_tokens) // bs)
        parent = prev_hashes[k - 1] if k else 0
        return tokens, prev_hashes[:k] + block_hashes(tokens[k * bs :], bs, parent)

    def _on_queue_timeout(self, live: _Live) -> None:
        if live.replica is not None or live.result.error is not None:
            return  # dispatched (or failed) since
        try:
            self._queue.remove(live)
        except ValueError:
            return
        self._live.pop(live.info.request_id, None)
        self._fail(live, "queue_timeout")

    def _fail(self, live: _Live, error: str) -> None:
        live.result.error = error
        self._results.append(live.result)
        self._client_done(live.req.index, ok=False)

    def _client_done(self, index: int, ok: bool = True) -> None:
        """The client whose request just ended sends its next one now: the session's next
        turn (or, after a failure, none: every later turn is counted as not sent), or in
        a closed loop the next request."""
        nxt = self._followers.get(index)
        while nxt is not None:
            if ok:
                self._push(self.now_s, ARRIVAL, nxt)
                return
            req = self.requests[nxt]
            self._arrivals_left -= 1
            self._results.append(
                RequestResult(
                    index=nxt,
                    arrival_s=self.now_s,
                    input_tokens=req.input_tokens,
                    output_tokens=0,
                    error="previous_turn_failed",
                )
            )
            nxt = self._followers.get(nxt)
        if self.config.closed_loop_clients and self._next_request < len(self.requests):
            self._push(self.now_s, ARRIVAL, self._next_request)
            self._next_request += 1

    # ------------------------------------------------------------------ engine steps
    def _step(self, replica: SimReplica) -> None:
        outcome = replica.engine.step()
        if outcome.duration_s <= 0.0 and not outcome.emitted:
            replica.stepping = replica.engine.has_work
            if replica.stepping:
                self._push(self.now_s + _IDLE_RETRY_S, RETRY, replica)
            return
        replica.stepping = True
        self._push(outcome.now_s, STEP_DONE, (replica, outcome))

    def _on_wake(self, replica: SimReplica) -> None:
        if replica.stopped_at_s is None:
            self._step(replica)

    def _on_retry(self, replica: SimReplica) -> None:
        if replica.stopped_at_s is None:
            replica.engine.advance_to(self.now_s)
            self._step(replica)

    def _on_step_done(self, payload: Any) -> None:
        replica, outcome = payload
        now = self.now_s
        view = replica.view
        live_map = self._live
        for ereq in outcome.emitted:
            live = live_map.get(ereq.request_id)
            if live is None:
                continue
            if live.result.first_token_s is None:
                live.result.first_token_s = now
                self.routing.on_first_token(live.info, view)
        for ereq in outcome.finished:
            live = live_map.pop(ereq.request_id, None)
            if live is None:
                continue
            res = live.result
            res.finished_s = now
            res.output_tokens = ereq.num_output_tokens
            res.prefix_hit_tokens = ereq.num_prefix_hit_tokens
            res.preemptions = ereq.num_preemptions
            self._results.append(res)
            if live.req.index in self._followers:  # the next turn resends these tokens
                self._turn_tokens[live.req.index] = (ereq.all_token_ids, ereq.block_hashes)
            replica.live_ids.discard(ereq.request_id)
            replica.change_in_flight(now, -1)
            self.routing.on_finished(live.info, view, True)
            ttft = res.ttft_s
            if ttft is not None:
                self._ttft_window.add(now, ttft)
            tpot = res.tpot_s
            if tpot is not None:
                self._tpot_window.add(now, tpot)
            self._client_done(live.req.index)
        if replica.stopped_at_s is not None:
            replica.stepping = False
            return
        if replica.engine.has_work:
            self._step(replica)
        else:
            replica.stepping = False
            if replica.state is ReplicaState.DRAINING and view.in_flight == 0:
                self._stop_replica(replica)

    # ------------------------------------------------------------------ scraping
    def _on_scrape(self, _: Any) -> None:
        now = self.now_s
        for r in self.replicas.values():
            if r.state in (ReplicaState.READY, ReplicaState.DRAINING):
                e = r.engine
                r.view.stats = EngineStats(
                    num_running=e.num_running,
                    num_waiting=e.num_waiting,
                    kv_cache_usage=e.kv_cache_usage,
                    scraped_at_s=now,
                    in_flight_at_scrape=r.view.in_flight,
                )
                if not r.capacity_reported:
                    # vllm:cache_config_info: the gateway sizes the prefix index from it.
                    r.capacity_reported = True
                    set_capacity = getattr(self.routing, "set_capacity_tokens", None)
                    if set_capacity is not None:
                        cfg = e.config
                        set_capacity(r.replica_id, cfg.num_gpu_blocks * cfg.block_size)
        self._push(now + self.config.scrape_interval_s, SCRAPE)

    # ------------------------------------------------------------------ fleet changes
    def _start_replica(self, now: float, startup_s: float) -> SimReplica:
        rid = f"r{self._next_replica}"
        replica = SimReplica.create(
            rid,
            self.config.model,
            self.config.engine,
            self.config.step_time_model,
            now_s=now,
            startup_s=startup_s,
            seed=self.config.seed * 7919 + self._next_replica,
        )
        self._next_replica += 1
        self.replicas[rid] = replica
        if replica.state is ReplicaState.READY:
            self._ready.append(replica.view)
            self._drain_queue()
        else:
            self._push(now + startup_s, REPLICA_READY, replica)
        return replica

    def _on_ready(self, replica: SimReplica) -> None:
        if replica.state is not ReplicaState.STARTING:
            return  # stopped while starting
        now = self.now_s
        replica.set_state(ReplicaState.READY)
        replica.managed.ready_at_s = now
        replica.engine.advance_to(now)
        replica.last_change_s = now
        self._cold_starts_s.append(now - replica.managed.started_at_s)
        self._ready.append(replica.view)
        self._record_fleet()
        self._drain_queue()

    def _drain_queue(self) -> None:
        while self._queue and self._ready:
            self._dispatch(self._queue.popleft())

    def _drain_replica(self, replica: SimReplica) -> None:
        if replica.state is ReplicaState.STARTING:
            self._stop_replica(replica)  # never served: nothing to drain
            return
        if replica.state is not ReplicaState.READY:
            return
        replica.set_state(ReplicaState.DRAINING)
        self._ready = [v for v in self._ready if v.replica_id != replica.replica_id]
        if replica.view.in_flight == 0:
            self._stop_replica(replica)
        else:
            assert self.config.autoscale is not None
            self._push(self.now_s + self.config.autoscale.drain_deadline_s, DRAIN_DEADLINE, replica)

    def _on_drain_deadline(self, replica: SimReplica) -> None:
        if replica.stopped_at_s is not None:
            return
        for rid in sorted(replica.live_ids):
            live = self._live.pop(rid, None)
            replica.engine.abort(rid)
            if live is not None:
                replica.change_in_flight(self.now_s, -1)
                self.routing.on_finished(live.info, replica.view, False)
                self._fail(live, "drain_deadline")
        replica.live_ids.clear()
        self._stop_replica(replica)

    def _stop_replica(self, replica: SimReplica) -> None:
        replica.close_books(self.now_s)
        replica.stopped_at_s = self.now_s
        replica.set_state(ReplicaState.DEAD)
        self._ready = [v for v in self._ready if v.replica_id != replica.replica_id]
        self.routing.on_replica_removed(replica.replica_id)
        self._record_fleet()

    def _record_fleet(self) -> None:
        live = [r for r in self.replicas.values() if r.stopped_at_s is None]
        ready = sum(1 for r in live if r.state is ReplicaState.READY)
        self._fleet_size.append((self.now_s, ready, len(live)))

    # ------------------------------------------------------------------ autoscaling
    def gateway_signals(self) -> dict[str, Any]:
        """The dict the live gateway's `signals()` returns, built by the same function."""
        now = self.now_s
        # The gateway only knows replicas once they pass /health (not the starting ones).
        known = [
            r.view
            for r in self.replicas.values()
            if r.state not in (ReplicaState.DEAD, ReplicaState.STARTING)
        ]
        queued = {self.config.model: len(self._queue)} if self._queue else {}
        latency = latency_signals(now, self._ttft_window, self._tpot_window)
        return gateway_signals(now, known, len(self._queue), queued, latency)

    def _on_tick(self, _: Any) -> None:
        spec = self.config.autoscale
        assert spec is not None
        now = self.now_s
        managed = [r.managed for r in self.replicas.values() if r.state is not ReplicaState.DEAD]
        cold = sum(self._cold_starts_s) / len(self._cold_starts_s) if self._cold_starts_s else None
        signals = fleet_signals(self.gateway_signals(), managed, cold)
        decision = spec.policy.decide(now, signals)
        self._decisions.append(decision)
        delta = decision.desired_replicas - signals.current_replicas
        if delta > 0:
            for _ in range(delta):
                self._start_replica(now, spec.startup_s)
            self._record_fleet()
        elif delta < 0:
            mine = {m.replica_id for m in managed}
            for rid in scale_in_order(signals, mine)[:-delta]:
                self._drain_replica(self.replicas[rid])
        self._push(now + spec.interval_s, TICK)

    # ------------------------------------------------------------------ results
    def _replica_record(self, r: SimReplica, end_s: float) -> ReplicaRecord:
        if r.stopped_at_s is None:
            r.close_books(end_s)
        s = r.engine.stats
        ready = r.managed.ready_at_s
        served_s = max(0.0, (r.stopped_at_s or end_s) - (ready if ready is not None else end_s))
        return ReplicaRecord(
            replica_id=r.replica_id,
            started_s=r.managed.started_at_s,
            ready_s=ready,
            stopped_s=r.stopped_at_s,
            lifetime_s=r.lifetime_s(end_s),
            requests=r.requests_routed,
            mean_in_flight=r.in_flight_seconds / served_s if served_s > 0 else 0.0,
            peak_in_flight=r.peak_in_flight,
            prefix_queries_tokens=s.prefix_cache_queries_tokens,
            prefix_hits_tokens=s.prefix_cache_hits_tokens,
            preemptions=s.num_preemptions,
            steps=s.num_steps,
        )


def engine_for(config: SimConfig, seed: int = 0) -> Engine:
    """A bare engine of the fleet's replica type (for engine-only comparisons)."""
    return Engine(config.engine, config.step_time_model, seed=seed)
