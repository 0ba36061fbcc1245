"""The proxy: one completion request from admission to its last byte.

`Proxy.handle` authenticates, validates and admits the request, then `route` tries
replicas (retrying elsewhere on a failure before the first byte) and forwards the answer,
streamed chunk by chunk; a stream that breaks after its first byte is resumed elsewhere by
`gateway.failover`. Per request everything lives in one `RequestContext`.

Hot path: the body is read once and forwarded as the same bytes; streamed chunks are
written to the client from the upstream connection's callbacks (`gateway.relay`);
nothing is logged per request.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from gpufleet.fleet_state import FleetState, Refusal, needs_prefix_hashes
from gpufleet.gateway.admission import TableChanges, choose_ready, choose_replica
from gpufleet.gateway.config import GatewayConfig
from gpufleet.gateway.context import Failure, RequestContext
from gpufleet.gateway.continuation import Splicer, Transcript
from gpufleet.gateway.failover import Failover, FailoverPlan, Interrupted
from gpufleet.gateway.http_adapters import JSON, In, Out, send_error
from gpufleet.gateway.lora_loader import AdapterLoader, request_body_for
from gpufleet.gateway.metrics import GatewayMetrics
from gpufleet.gateway.relay import StallWatch, StreamRelay
from gpufleet.gateway.replicas import Replica
from gpufleet.gateway.request_meta import BadRequest, parse_body
from gpufleet.gateway.tenants import Tenant, TenantTable
from gpufleet.gateway.upstream import (
    GatewayOverloaded,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
    request_head,
)
from gpufleet.openai_errors import sse_error_event
from gpufleet.routing.prefix import request_prefix_hashes
from gpufleet.routing.types import RequestInfo

# Request headers never forwarded upstream (hop-by-hop, or set by the gateway).
_DROP_HEADERS = frozenset({
    b"host", b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization",
    b"transfer-encoding", b"te", b"trailer", b"upgrade", b"content-length", b"expect",
    b"accept-encoding",
})  # fmt: skip


class Proxy:
    def __init__(
        self,
        config: GatewayConfig,
        fleet: FleetState[Replica],
        tenants: TenantTable,
        metrics: GatewayMetrics,
        changes: TableChanges,
        pool: Callable[[], UpstreamPool | None],
        loader: AdapterLoader,
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.fleet = fleet
        self.tenants = tenants
        self.metrics = metrics
        self.changes = changes
        self._pool = pool
        self.loader = loader
        self._request_ids = itertools.count(1)
        fo = config.failover
        self.watch = StallWatch(max(0.05, min(1.0, fo.inter_token_timeout_s / 4)))
        self.failover = Failover(self)
        self._failover_models = {m: c for m, c in fo.models.items()}

    # -- admission steps ------------------------------------------------------------------
    async def handle(
        self, request: In, out: Out, endpoint: str, path: str, t0_s: float | None = None
    ) -> None:
        """Authenticate, validate, admit, route and forward one completion request that
        arrived at `t0_s` (default: now; the lean front calls this directly)."""
        if t0_s is None:
            t0_s = time.monotonic()
        limits = self.limits
        count = self.metrics.count_request
        header_bytes = 0
        for k, v in request.raw_headers:
            header_bytes += len(k) + len(v) + 4
        if header_bytes > limits.max_header_bytes:
            count("", "", 431)
            return send_error(out, 431, f"request headers exceed {limits.max_header_bytes} bytes")
        auth = request.header(b"authorization")
        tenant = self.tenants.resolve(auth.decode("latin-1") if auth is not None else None)
        if tenant is None:
            count("", "", 401)
            return send_error(out, 401, "missing or unknown API key (Authorization: Bearer ...)",
                              code="invalid_api_key")  # fmt: skip
        try:
            meta = parse_body(request.body, endpoint)
        except BadRequest as exc:
            count("", tenant.name, exc.status)
            return send_error(out, exc.status, str(exc), param=exc.param)
        model = meta.model
        if not self.fleet.model_known(model):
            count("", tenant.name, 404)  # not the client's string: unbounded label values
            return send_error(out, 404, f"the model '{model}' does not exist", param="model",
                              code="model_not_found")  # fmt: skip
        retry_after_s = tenant.admit(t0_s)
        if retry_after_s:
            count(model, tenant.name, 429)
            return send_error(out, 429, f"rate limit reached for tenant {tenant.name!r}",
                              headers={"Retry-After": str(retry_after_s)})  # fmt: skip
        try:
            policy = self.fleet.policy_for(tenant.name)
            hashes: tuple[int, ...] = ()
            if self.fleet.needs_prefix and needs_prefix_hashes(policy):
                hashes = request_prefix_hashes(meta.body, endpoint)
            session = request.header(b"x-session-id")
            base, adapter = self.fleet.resolve(model)  # a LoRA adapter: its base's replicas
            info = RequestInfo(
                request_id=f"gw-{next(self._request_ids)}",
                model=base,
                adapter=adapter,
                tenant=tenant.name,
                session_key=session.decode("latin-1") if session is not None else meta.user,
                prefix_hashes=hashes,
            )
            headers = self._forward_headers(request.raw_headers)
            ctx = RequestContext(request.body, out, headers, info, policy, tenant, path, t0_s,
                                 meta.body, self.failover_plan(tenant, model))  # fmt: skip
            await self.route(ctx)
        finally:
            tenant.release()
            count(model, tenant.name, out.status)

    def failover_plan(self, tenant: Tenant, model: str) -> FailoverPlan | None:
        """How this request is resumed if its replica fails mid-answer (None: it is not).
        The most specific setting wins: the tenant's, then the model's, then the gateway's."""
        fo = self.config.failover
        enabled, dialect = fo.enabled, fo.dialect
        per_model = self._failover_models.get(model)
        if per_model is not None:
            enabled = enabled if per_model.enabled is None else per_model.enabled
            dialect = per_model.dialect or dialect
        if tenant.failover is not None:
            enabled = tenant.failover
        return FailoverPlan(dialect, fo.max_resumes) if enabled else None

    def _forward_headers(self, raw_headers: Any) -> bytes:
        """The client's headers as raw bytes, minus hop-by-hop ones (and the gateway key)."""
        strip_auth = self.tenants.enabled
        parts = []
        has_type = False
        for k, v in raw_headers:
            lk = k.lower()
            if lk in _DROP_HEADERS or (strip_auth and lk == b"authorization"):
                continue
            if lk == b"content-type":
                has_type = True
            parts.append(b"%s: %s\r\n" % (k, v))
        if not has_type:
            parts.append(b"Content-Type: application/json\r\n")
        return b"".join(parts)

    # -- routing and retries --------------------------------------------------------------
    async def route(self, ctx: RequestContext) -> None:
        max_attempts = self.limits.max_attempts
        deadline_s = ctx.t0_s + self.fleet.queue.limits(ctx.info.model).timeout_s
        tried: tuple[Replica, ...] = ()
        failure: Failure | None = None
        attempts = 0
        while True:
            chosen: Replica | Refusal | None
            chosen = choose_ready(self.fleet, ctx.info, ctx.policy, ctx.tenant.pool, tried)
            if chosen is not None and attempts == 0:
                self.fleet.arrived(time.monotonic(), ctx.info.model)  # (`admit` counts the rest)
            if chosen is None:  # none eligible now: wait in the queue (or give up)
                chosen = await choose_replica(self.fleet, ctx.info, ctx.policy, ctx.tenant.pool,
                                              deadline_s, self.changes, tried,
                                              first_try=attempts == 0)  # fmt: skip
                if chosen is None:
                    break  # every ready replica already failed this request
                if isinstance(chosen, Refusal):
                    return (failure or Failure.refused(chosen)).send(ctx.out)
            replica = chosen
            result = await self.attempt(ctx, replica)
            if result is None:
                return
            if isinstance(result, Interrupted):  # broke after its first byte
                return await self.failover.resume(ctx, result)
            failure = result
            if result.final:
                break
            attempts += 1
            if not result.again:
                tried = (*tried, replica)
            if attempts >= max_attempts:
                break
            if result.mid_generation and ctx.failover is not None:
                self.metrics.count_resume(ctx.model, "non_streamed", 0)
            replica.m_retries.inc()
        assert failure is not None
        failure.send(ctx.out)

    def read_timeout_s(self, t0_s: float) -> float:
        limits = self.limits
        if limits.total_timeout_s is None:
            return limits.read_timeout_s
        left_s = t0_s + limits.total_timeout_s - time.monotonic()
        if left_s <= 0:
            raise UpstreamTimeout("the request ran past limits.total_timeout_s")
        return min(limits.read_timeout_s, left_s)

    async def open_upstream(self, replica: Replica, data: bytes, t0_s: float) -> UpstreamResponse:
        """Send and wait for the response head. A kept-alive connection the replica had
        already closed is retried once on a fresh one, without blaming the replica."""
        pool = self._pool()
        assert pool is not None
        up = await pool.send(replica.addr, data)
        try:
            await up.headers(self.read_timeout_s(t0_s))
            return up
        except UpstreamError as exc:
            up.release()
            if isinstance(exc, UpstreamTimeout) or not up.reused or up.got_bytes:
                raise
        except BaseException:  # cancelled (client gone): reset the upstream connection
            up.release()
            raise
        up = await pool.fresh(replica.addr, data)
        try:
            await up.headers(self.read_timeout_s(t0_s))
        except BaseException:
            up.release()
            raise
        return up

    # -- one attempt on one replica -------------------------------------------------------
    async def attempt(self, ctx: RequestContext, replica: Replica) -> Failure | Interrupted | None:
        """One try on one replica: None once a response went out, a Failure before any
        byte did, or Interrupted when a stream broke after its first byte."""
        fleet = self.fleet
        fleet.started(ctx.info, replica, ctx.policy)
        replica.m_requests.inc()
        ctx.ok = ctx.streamed = False
        try:
            body = ctx.body
            info = ctx.info
            if info.adapter is not None:
                spec = fleet.adapter_missing(info, replica)
                if spec is not None:  # load it there first (requests meanwhile share the load)
                    loaded = await self.loader.ensure(replica, spec)
                    if not loaded.ok:
                        return Failure(loaded.status, loaded.message)
                body = request_body_for(replica, body, info.model, info.adapter)
            head = request_head(b"POST", replica.host_header, ctx.path.encode(), len(body))
            data = b"".join((head, ctx.headers, b"\r\n", body))
            try:
                upstream = await self.open_upstream(replica, data, ctx.t0_s)
            except UpstreamTimeout:
                replica.m_errors.inc()
                return Failure(504, f"replica {replica.replica_id} did not answer in time",
                               final=True)  # fmt: skip
            except GatewayOverloaded as exc:  # ours, not the replica's: no blame, no retry
                return Failure(503, f"the gateway is overloaded: {exc}", final=True,
                               headers={"Retry-After": "1"})  # fmt: skip
            except UpstreamConnectError as exc:
                return self._failed(replica, 502, f"replica {replica.replica_id} failed: {exc}")
            except UpstreamError as exc:
                return self._failed(replica, 502, f"replica {replica.replica_id} broke: {exc}",
                                    mid_generation=True)  # fmt: skip
            try:
                status = upstream.status
                ctype = upstream.content_type.decode("latin-1") or JSON
                if status == 200 and ctype.startswith("text/event-stream"):
                    return await self._stream(ctx, upstream, replica)
                try:
                    body = await upstream.read_all(self.read_timeout_s(ctx.t0_s))
                except UpstreamTimeout:
                    replica.m_errors.inc()
                    return Failure(504, f"replica {replica.replica_id} timed out", final=True)
                except UpstreamError as exc:
                    return self._failed(replica, 502, f"replica {replica.replica_id} broke: "
                                        f"{exc}", mid_generation=True)  # fmt: skip
                if status >= 500:
                    return self._failed(replica, status, "", body, ctype)
                if status == 404 and info.adapter is not None:
                    # It lost the adapter (restarted?): load it again and resend.
                    fleet.adapter_forgotten(replica, info.adapter)
                    return Failure(404, "", body=body, content_type=ctype, again=True)
                ctx.ok = status < 400
                fleet.table.record_success(replica)
                e2e = self.metrics.latency(ctx.model, ctx.tenant.name)[3]
                e2e.observe(time.monotonic() - ctx.t0_s)
                ctx.out.send(status, body, ctype)
                return None
            finally:
                # Reuses a cleanly finished connection; otherwise resets it, which is how a
                # gone client (its handler cancelled) closes the upstream request at once.
                upstream.release()
        finally:
            fleet.finished(ctx.info, replica, ctx.policy, ctx.ok, ctx.streamed)

    def _failed(
        self, replica: Replica, status: int, message: str, body: bytes | None = None,
        ctype: str = JSON, mid_generation: bool = False,
    ) -> Failure:  # fmt: skip
        replica.m_errors.inc()
        self.fleet.table.record_failure(replica, time.monotonic())
        failure = Failure(status, message, body=body, content_type=ctype)
        failure.mid_generation = mid_generation
        return failure

    async def _stream(
        self, ctx: RequestContext, upstream: UpstreamResponse, replica: Replica
    ) -> Failure | Interrupted | None:
        """Relay an SSE answer. A Failure before its first chunk; then None (a clean end)
        or Interrupted (broke after the client had bytes: the failover takes it from there)."""
        try:
            first = await upstream.read_chunk(self.read_timeout_s(ctx.t0_s))
        except UpstreamTimeout:
            replica.m_errors.inc()
            return Failure(504, f"replica {replica.replica_id} timed out", final=True)
        except UpstreamError as exc:
            return self._failed(replica, 502, f"replica {replica.replica_id} broke: {exc}",
                                mid_generation=True)  # fmt: skip
        if not first:
            return self._failed(replica, 502, f"replica {replica.replica_id} sent no data")
        ctx.ttft_s = time.monotonic() - ctx.t0_s
        self.fleet.first_token(ctx.info, replica, ctx.policy)
        ctx.streamed = True
        ctx.transcript = Transcript(ctx.chat)
        await ctx.out.start_stream(200, "text/event-stream")
        interrupted = await self.relay(ctx, upstream, replica, first, None)
        if interrupted is None:
            await self.end_stream(ctx, None)
        return interrupted

    async def relay(
        self,
        ctx: RequestContext,
        upstream: UpstreamResponse,
        replica: Replica,
        first: bytes,
        splice: Splicer | None,
    ) -> Interrupted | None:
        """Relay one attempt's stream from `first` on; None when it ended cleanly."""
        assert ctx.transcript is not None
        itl = self.metrics.latency(ctx.model, ctx.tenant.name)[2]
        relay = StreamRelay(ctx.out, upstream, ctx.transcript, splice, replica, itl,
                            self.config.failover.inter_token_timeout_s)  # fmt: skip
        outcome = await self.watch.relay(relay, first)
        ctx.events += relay.events
        if outcome is None:
            ctx.ok = True
            self.fleet.table.record_success(replica)
            return None
        if outcome.replica_failed:
            replica.m_errors.inc()
            self.fleet.table.record_failure(replica, time.monotonic())
        return Interrupted(outcome, replica)

    async def end_stream(self, ctx: RequestContext, error: str | None) -> None:
        """The end of a streamed answer: an error event (and [DONE]) when it broke for
        good, else the latency metrics."""
        now_s = time.monotonic()
        if error is not None:
            await ctx.out.write(sse_error_event(f"upstream error: {error}", 502))
        elif ctx.ttft_s is not None:
            # Events minus the [DONE] marker approximate the tokens streamed.
            usage = ctx.transcript.usage() if ctx.transcript is not None else None
            self.metrics.observe_stream(ctx.model, ctx.tenant.name, ctx.ttft_s,
                                        now_s - ctx.t0_s, max(1, ctx.events - 1), now_s,
                                        usage)  # fmt: skip
        await ctx.out.end()
