"""The simulated clients: requests arrive, become engine requests, end in a result; a
client whose request ended sends its next one (a session's next turn, or in a closed loop
the next request)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from gpufleet.engine import EngineRequest
from gpufleet.engine.request import COUNTED_TOKEN, CountedOutputRequest, TokenSpans
from gpufleet.fleet_state import FleetReplica, Refusal
from gpufleet.hash_runs import HashChain, Runs, cut_runs_on, hash_at, runs_of
from gpufleet.routing.types import RequestInfo, RoutingPolicy
from gpufleet.sim.events import ARRIVAL, EventQueue, SimClock
from gpufleet.sim.results import RequestResult
from gpufleet.workload import SegmentHasher, SimRequest, placeholder_token_ids

if TYPE_CHECKING:
    from gpufleet.sim.config import SimConfig
    from gpufleet.sim.gateway import SimGateway
    from gpufleet.sim.replica import SimReplica
    from gpufleet.sim.tenants import SimTenant, SimTenants

_NEXT_TURN = -0x7E27  # tags the blocks a session's next turn adds, in their hashes
_PLACEHOLDER = placeholder_token_ids(1)[0]  # the token of a prompt's own (new) text


class LiveRequest:
    """A request between its arrival and its result. (A plain class: one per request, and
    mypyc compiles only an explicit `__init__`.)"""

    __slots__ = (
        "engine_req", "info", "policy", "prompt", "replica", "req", "result", "tenant", "tried",
    )  # fmt: skip

    def __init__(
        self,
        req: SimRequest,
        info: RequestInfo,
        result: RequestResult,
        policy: RoutingPolicy,  # its tenant's routing policy, or the fleet's
        tenant: SimTenant | None = None,  # admitted by its limits (released when it ends)
    ) -> None:
        self.req = req
        self.info = info
        self.result = result
        self.policy = policy
        self.tenant = tenant
        self.replica: SimReplica | None = None
        self.engine_req: EngineRequest | None = None
        # replicas that failed it before its first token
        self.tried: tuple[FleetReplica, ...] = ()
        self.prompt: tuple[TokenSpans, Runs | None] | None = None  # kept for a retry

    @property
    def pool(self) -> str | None:
        return self.tenant.pool if self.tenant is not None else None


class Clients:
    def __init__(
        self,
        config: SimConfig,
        requests: Sequence[SimRequest],
        events: EventQueue,
        clock: SimClock,
        needs_prefix: bool,
        policy: RoutingPolicy,
        tenants: SimTenants | None = None,
    ) -> None:
        self.config = config
        self.policy = policy  # the fleet's routing policy (a tenant may have its own)
        self.tenants = tenants
        self.requests = list(requests)
        self.events = events
        self.clock = clock
        self.needs_prefix = needs_prefix
        self.gateway: SimGateway | None = None  # set by the simulator
        eng = config.engine
        self._engine_hasher = SegmentHasher(eng.block_size) if eng.enable_prefix_caching else None
        self._routing_hasher = SegmentHasher(config.routing_block_tokens)
        self._max_model_len = config.max_model_len  # (over the replica groups: once)
        self._closed_loop = bool(config.closed_loop_clients)
        self._model = config.model
        self._seed_base = config.seed * 1_000_003  # engine seeds: base + request index
        self.live: dict[str, LiveRequest] = {}  # sent and not ended, by request id
        self.results: list[RequestResult] = []
        self.arrivals_left = len(self.requests)
        self._next_request = 0  # closed loop: next request to hand a client
        self._turn_tokens: dict[int, tuple[TokenSpans, int, int, Runs]] = {}
        # Open loop: (time, event sequence, index) of the first turns not queued yet.
        self._feed: Iterator[tuple[float, int, int]] = iter(())
        # Multi-turn sessions: request index -> the next turn, sent when it ends.
        self._followers: dict[int, int] = {
            r.after: r.index for r in self.requests if r.after is not None
        }

    def start(self) -> None:
        """The first arrivals: every open-loop request (first turns), or one per client."""
        clients = self.config.closed_loop_clients
        if clients:
            if self._followers:
                raise ValueError("closed-loop clients cannot replay multi-turn sessions")
            for _ in range(min(clients, len(self.requests))):
                self.events.push(0.0, ARRIVAL, self._next_request)
                self._next_request += 1
        else:  # fed one at a time: the heap holds the next, not every arrival of the run
            firsts = [r for r in self.requests if r.after is None]
            seq = self.events.reserve(len(firsts))  # (the order of pushing them all now)
            self._feed = iter(sorted((r.arrival_s, seq + k, r.index)
                                     for k, r in enumerate(firsts)))  # fmt: skip
            self._feed_next()

    def _feed_next(self) -> None:
        """Queue the next open-loop arrival (the earliest left: the heap pops it first)."""
        nxt = next(self._feed, None)
        if nxt is not None:
            self.events.push_reserved(nxt[0], ARRIVAL, nxt[1], nxt[2])

    @property
    def done(self) -> bool:
        return self.arrivals_left == 0 and not self.live

    def on_arrival(self, index: int) -> None:
        req = self.requests[index]
        now = self.clock.now_s
        if req.after is None and not self._closed_loop:
            self._feed_next()  # (it came from the feed: queue the one after it)
        self.arrivals_left -= 1
        input_tokens = req.input_tokens  # (a sum over its segments: counted once, kept here)
        result = RequestResult(index=index, arrival_s=now, input_tokens=input_tokens,
                               output_tokens=0)  # fmt: skip
        tenants = self.tenants
        tenant = tenants.of(index) if tenants is not None else None
        hashes: Sequence[int] = ()
        if self.needs_prefix:
            # (the runs, hashed once; the chain held as them: no int per block)
            hashes = HashChain(self._routing_hasher.runs(req.segments))
        info = RequestInfo(
            request_id=f"sim-{index}",
            model=self._model,
            prompt_tokens=0,  # the live gateway does not tokenize either
            tenant=tenant.name if tenant is not None else None,
            session_key=req.session_key,
            prefix_hashes=hashes,
            adapter=req.adapter,
        )
        if tenant is None:
            live = LiveRequest(req, info, result, self.policy)
        else:
            live = LiveRequest(req, info, result, tenant.policy)
            result.tenant = tenant.name
            if tenant.limits.admit(now):  # over its rate or concurrency: the gateway's 429
                self.fail(live, "rate_limited")
                return
            live.tenant = tenant
        if input_tokens + req.output_tokens > self._max_model_len:
            # The replica refuses it with a 400, as vLLM does.
            self.fail(live, "context_length_exceeded")
            return
        self.live[info.request_id] = live
        assert self.gateway is not None
        self.gateway.arrive(live)

    def engine_request(self, live: LiveRequest, now_s: float) -> EngineRequest:
        req = live.req
        if live.prompt is None:  # built once: a retry sends the same prompt
            live.prompt = self._engine_prompt(req, live.result.input_tokens)
        spans, runs = live.prompt
        live.result.attempts += 1
        # Only the answer's length matters here: its token ids are never computed, nor
        # the prompt's (its spans stand for them; a retry resends the same).
        return CountedOutputRequest.of_spans(
            live.info.request_id,
            spans,
            req.output_tokens,
            seed=self._seed_base + req.index,
            prompt_block_runs=runs,  # (each attempt's own chain, built from them)
            arrival_s=now_s,
        )

    def _engine_prompt(self, req: SimRequest, input_tokens: int) -> tuple[TokenSpans, Runs | None]:
        """Token ids (as spans) and engine block hashes (as runs: hashed once, whatever the
        attempts) of a prompt. A session's next turn starts with the previous turn's own
        tokens (its prompt and the answer the engine generated), so the engine finds the
        answer's cached blocks as a live replica would."""
        prev = self._turn_tokens.pop(req.after, None) if req.after is not None else None
        hasher = self._engine_hasher
        if prev is None:
            runs = hasher.runs(req.segments) if hasher is not None else None
            return ((_PLACEHOLDER, input_tokens),), runs
        prev_spans, prev_prompt_len, prev_answer, prev_runs = prev  # (answer: counted)
        prev_len = prev_prompt_len + prev_answer
        more = max(0, input_tokens - prev_len)
        spans = (*prev_spans, (COUNTED_TOKEN, prev_answer), (_PLACEHOLDER, more))
        if hasher is None:
            return spans, None
        bs = hasher.block_tokens
        k = min(sum(n for _, n in prev_runs), prev_len // bs)
        parent = hash_at(prev_runs, k - 1) if k else 0
        # The blocks after the last one the previous turn hashed hold placeholders: only
        # the chain they continue and the previous turn's length tell them apart, so they
        # hash as consecutive ints from those (no per-block work).
        base = hash((parent, _NEXT_TURN, prev_len))
        return spans, cut_runs_on(prev_runs, k, base, (prev_len + more) // bs - k)

    def finish(self, live: LiveRequest, ereq: EngineRequest, now_s: float) -> RequestResult:
        """The request's last token reached its client (it left `live` already)."""
        res = live.result
        res.finished_s = now_s
        res.output_tokens = ereq.num_output_tokens
        res.prefix_hit_tokens = ereq.num_prefix_hit_tokens
        res.preemptions = ereq.num_preemptions
        self.results.append(res)
        if live.tenant is not None:
            live.tenant.limits.release()
        if live.req.index in self._followers:  # the next turn resends these tokens
            hashes = ereq.block_hashes
            runs = (
                list(hashes.runs)
                if isinstance(hashes, HashChain)
                else runs_of(hashes, ereq.prompt_runs)  # (its runs found once)
            )
            assert isinstance(ereq, CountedOutputRequest)  # (`engine_request` made it)
            self._turn_tokens[live.req.index] = (
                ereq.prompt_spans,
                ereq.num_prompt_tokens,
                ereq.num_output_tokens,
                runs,
            )
        return res

    def refused(self, live: LiveRequest, refusal: Refusal) -> None:
        """The gateway answered an error (the queue's 503)."""
        self.end(live, refusal.reason)

    def end(self, live: LiveRequest, error: str) -> None:
        """It ends in an error after reaching the gateway (no longer in `live`)."""
        self.live.pop(live.info.request_id, None)
        if live.replica is not None:
            live.replica.live_ids.discard(live.info.request_id)
        self.fail(live, error)

    def fail(self, live: LiveRequest, error: str) -> None:
        live.result.error = error
        if live.req.after is not None:  # a turn that failed before its engine: the
            self._turn_tokens.pop(live.req.after, None)  # history it would resend is done
        self.results.append(live.result)
        if live.tenant is not None:
            live.tenant.limits.release()
        self.client_done(live.req.index, ok=False)

    def client_done(self, index: int, ok: bool = True) -> None:
        """The client whose request just ended sends its next one now: the session's next
        turn (or, after a failure, none: every later turn is counted as not sent), or in
        a closed loop the next request."""
        now = self.clock.now_s
        nxt = self._followers.pop(index, None)  # (each request ends once: let it go)
        while nxt is not None:
            if ok:
                self.events.push(now, ARRIVAL, nxt)
                return
            req = self.requests[nxt]
            self.arrivals_left -= 1
            self.results.append(
                RequestResult(
                    index=nxt,
                    arrival_s=now,
                    input_tokens=req.input_tokens,
                    output_tokens=0,
                    error="previous_turn_failed",
                )
            )
            nxt = self._followers.pop(nxt, None)
        if self.config.closed_loop_clients and self._next_request < len(self.requests):
            self.events.push(now, ARRIVAL, self._next_request)
            self._next_request += 1
