"""Mid-stream failover: a stream whose replica fails after the client got its first bytes
is finished on another replica.

`Failover.resume` takes what the client was sent (the request's `Transcript`), builds the
request that continues it (`continuation.continuation_body`), sends it to another eligible
replica and splices the continuation into the client's stream (`continuation.Splicer`:
one id, no second role chunk, usage that adds up, [DONE] once). It tries up to the plan's
`max_resumes` times; then, or when the request cannot be continued (tool calls, n > 1, an
engine without a way to continue, failover off), the client gets an error event and
[DONE], as without failover. Every resume, the tokens it carried over and every give-up
are counted in /metrics.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufleet.fleet_state import Refusal
from gpufleet.gateway.admission import choose_ready, choose_replica
from gpufleet.gateway.continuation import Finished, Splicer, StreamState, continuation_body
from gpufleet.gateway.relay import Broken
from gpufleet.gateway.replicas import Replica
from gpufleet.gateway.upstream import UpstreamError, UpstreamTimeout, request_head

if TYPE_CHECKING:
    from gpufleet.gateway.context import RequestContext
    from gpufleet.gateway.proxy import Proxy


@dataclass(frozen=True, slots=True)
class FailoverPlan:
    """How one request is resumed: the engines' continuation dialect and the budget."""

    dialect: str
    max_resumes: int


class Interrupted:
    """A stream that broke after its first byte reached the client."""

    __slots__ = ("broken", "replica")

    def __init__(self, broken: Broken, replica: Replica) -> None:
        self.broken = broken
        self.replica = replica


class Failover:
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    async def resume(self, ctx: RequestContext, interrupted: Interrupted) -> None:
        """Finish the client's stream (continued elsewhere, or with an error event)."""
        broken = interrupted.broken
        if not broken.replica_failed:
            return  # the client left: nobody to answer
        proxy = self.proxy
        assert ctx.transcript is not None
        tried = [interrupted.replica]
        resumes = 0
        plan = ctx.failover
        while True:
            if plan is None:
                return await proxy.end_stream(ctx, broken.message)
            state = ctx.transcript.state()
            body = continuation_body(ctx.request, ctx.chat, state, plan.dialect)
            if isinstance(body, Finished):
                return await self._finish(ctx, state, body.finish_reason)
            if isinstance(body, str) or resumes >= plan.max_resumes:
                proxy.metrics.count_resume_failure(ctx.model)
                why = body if isinstance(body, str) else f"gave up after {resumes} resumes"
                return await proxy.end_stream(ctx, f"{broken.message} ({why})")
            resumes += 1
            proxy.metrics.count_resume(ctx.model, broken.kind, state.completion_tokens)
            replica = await self._choose(ctx, tried)
            if replica is None:
                proxy.metrics.count_resume_failure(ctx.model)
                return await proxy.end_stream(ctx, f"{broken.message} (no replica to resume on)")
            outcome = await self._attempt(ctx, replica, body, state)
            if outcome is None:
                return await proxy.end_stream(ctx, None)
            if not outcome.replica_failed:
                return
            broken = outcome
            tried.append(replica)

    async def _choose(self, ctx: RequestContext, tried: list[Replica]) -> Replica | None:
        """Another eligible replica: one not tried yet, else any but the last that failed,
        else wait in the admission queue for one (as a new request would)."""
        fleet = self.proxy.fleet
        pool = ctx.tenant.pool
        for avoid in (tried, tried[-1:]):
            chosen = choose_ready(fleet, ctx.info, ctx.policy, pool, avoid)
            if chosen is not None:
                return chosen
        deadline_s = time.monotonic() + fleet.queue.limits(ctx.info.model).timeout_s
        waited = await choose_replica(fleet, ctx.info, ctx.policy, pool, deadline_s,
                                      self.proxy.changes, first_try=False)  # fmt: skip
        return None if waited is None or isinstance(waited, Refusal) else waited

    async def _attempt(
        self, ctx: RequestContext, replica: Replica, body: dict[str, Any], state: StreamState
    ) -> Broken | None:
        """Send the continuation to `replica` and relay it; None when the answer is done."""
        proxy = self.proxy
        fleet = proxy.fleet
        payload = json.dumps(body).encode()
        head = request_head(b"POST", replica.host_header, ctx.path.encode(), len(payload))
        data = b"".join((head, ctx.headers, b"\r\n", payload))
        fleet.started(ctx.info, replica, ctx.policy)
        replica.m_requests.inc()
        ctx.ok = ctx.streamed = False
        try:
            try:
                upstream = await proxy.open_upstream(replica, data, ctx.t0_s)
            except UpstreamError as exc:
                return self._failed(replica, "reset", f"resume on {replica.replica_id}: {exc}")
            try:
                if upstream.status != 200 or not upstream.content_type.startswith(
                    b"text/event-stream"
                ):
                    detail = (await upstream.read_all(5.0))[:300].decode("utf-8", "replace")
                    return self._failed(replica, "engine_error", f"resume on "
                                        f"{replica.replica_id}: {upstream.status} {detail}")  # fmt: skip
                first = await upstream.read_chunk(proxy.read_timeout_s(ctx.t0_s))
                if not first:
                    return self._failed(replica, "eof", "the resumed stream was empty")
                fleet.first_token(ctx.info, replica, ctx.policy)
                ctx.streamed = True
                interrupted = await proxy.relay(ctx, upstream, replica, first, Splicer(state))
                return None if interrupted is None else interrupted.broken
            except UpstreamTimeout as exc:
                return self._failed(replica, "stall", f"resume on {replica.replica_id}: {exc}")
            except UpstreamError as exc:
                return self._failed(replica, "reset", f"resume on {replica.replica_id}: {exc}")
            finally:
                upstream.release()
        finally:
            fleet.finished(ctx.info, replica, ctx.policy, ctx.ok, ctx.streamed)

    def _failed(self, replica: Replica, kind: str, message: str) -> Broken:
        replica.m_errors.inc()
        self.proxy.fleet.table.record_failure(replica, time.monotonic())
        return Broken(kind, message)

    async def _finish(self, ctx: RequestContext, state: StreamState, reason: str) -> None:
        """Every token was sent but the end was cut: say how it finished, then [DONE]."""
        if state.finish_reason is None:
            model = ctx.request.get("model")
            choice: dict[str, Any] = (
                {"index": 0, "delta": {}, "finish_reason": reason}
                if ctx.chat
                else {"index": 0, "text": "", "finish_reason": reason}
            )
            event = {"id": state.id, "object": "chat.completion.chunk" if ctx.chat else
                     "text_completion", "created": state.created, "model": model,
                     "choices": [choice]}  # fmt: skip
            await ctx.out.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        if not state.done:
            await ctx.out.write(b"data: [DONE]\n\n")
        await self.proxy.end_stream(ctx, None)
