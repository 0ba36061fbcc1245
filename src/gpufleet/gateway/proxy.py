"""The proxy: one completion request from admission to its last byte.

`Proxy.handle` authenticates, validates and admits the request, then `route` tries
replicas (retrying elsewhere on a failure before the first byte) and forwards the answer,
streamed chunk by chunk. Per request everything lives in one `RequestContext`.

Hot path: the body is read once and forwarded as the same bytes; streamed chunks are
written to the client as they arrive; nothing is logged per request.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from gpufleet.fleet_state import FleetState, Refusal, needs_prefix_hashes
from gpufleet.gateway.admission import TableChanges, choose_ready, choose_replica
from gpufleet.gateway.config import GatewayConfig
from gpufleet.gateway.http_adapters import JSON, In, Out, send_error
from gpufleet.gateway.lora_loader import AdapterLoader, request_body_for
from gpufleet.gateway.metrics import GatewayMetrics
from gpufleet.gateway.replicas import Replica
from gpufleet.gateway.request_meta import BadRequest, parse_body
from gpufleet.gateway.tenants import Tenant, TenantTable
from gpufleet.gateway.upstream import (
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
    request_head,
)
from gpufleet.openai_errors import error_json_bytes, sse_error_event
from gpufleet.routing.prefix import request_prefix_hashes
from gpufleet.routing.types import RequestInfo, RoutingPolicy

# Request headers never forwarded upstream (hop-by-hop, or set by the gateway).
_DROP_HEADERS = frozenset({
    b"host", b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization",
    b"transfer-encoding", b"te", b"trailer", b"upgrade", b"content-length", b"expect",
    b"accept-encoding",
})  # fmt: skip
_DONE_TAIL = b"data: [DONE]"


class Failure:
    """A failed attempt before any byte reached the client: retry elsewhere or report.

    `final` failures (timeouts) are not retried: the request may still be running there.
    """

    __slots__ = ("again", "body", "code", "content_type", "final", "headers", "message",
                 "param", "status")  # fmt: skip

    def __init__(
        self,
        status: int,
        message: str,
        *,
        body: bytes | None = None,
        content_type: str = JSON,
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
        final: bool = False,
        again: bool = False,
    ) -> None:
        self.status = status
        self.message = message
        self.body = body
        self.content_type = content_type
        self.param = param
        self.code = code
        self.headers = headers
        self.final = final
        self.again = again  # worth another try on the same replica (its adapter reloaded)

    @classmethod
    def refused(cls, refusal: Refusal) -> Failure:
        return cls(refusal.status, refusal.message, param=refusal.param, code=refusal.code,
                   headers=refusal.headers)  # fmt: skip

    def send(self, out: Out) -> None:
        if self.body is not None:
            out.send(self.status, self.body, self.content_type, self.headers)
        else:
            body = error_json_bytes(self.message, self.status, param=self.param, code=self.code)
            out.send(self.status, body, JSON, self.headers)


class RequestContext:
    """One admitted completion request, as every step of the proxy needs it."""

    __slots__ = ("body", "headers", "info", "model", "out", "path", "policy", "streamed",
                 "t0_s", "tenant")  # fmt: skip

    def __init__(
        self,
        body: bytes,
        out: Out,
        headers: bytes,
        info: RequestInfo,
        policy: RoutingPolicy,
        tenant: Tenant,
        path: str,
        t0_s: float,
    ) -> None:
        self.body = body  # forwarded as is
        self.out = out
        self.headers = headers  # the client's, minus hop-by-hop ones, as raw bytes
        self.info = info
        self.model = info.adapter or info.model  # as the client named it (for metrics)
        self.policy = policy
        self.tenant = tenant
        self.path = path
        self.t0_s = t0_s
        self.streamed = False  # the current attempt's first chunk reached the client


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
            count(model, tenant.name, 404)
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
            ctx = RequestContext(request.body, out, headers, info, policy, tenant, path, t0_s)
            await self.route(ctx)
        finally:
            tenant.release()
            count(model, tenant.name, out.status)

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
        deadline_s = ctx.t0_s + self.fleet.queue.timeout_s
        tried: tuple[Replica, ...] = ()
        failure: Failure | None = None
        attempts = 0
        while True:
            chosen: Replica | Refusal | None
            chosen = choose_ready(self.fleet, ctx.info, ctx.policy, ctx.tenant.pool, tried)
            if chosen is None:  # none eligible now: wait in the queue (or give up)
                chosen = await choose_replica(self.fleet, ctx.info, ctx.policy, ctx.tenant.pool,
                                              deadline_s, self.changes, tried)  # fmt: skip
                if chosen is None:
                    break  # every ready replica already failed this request
                if isinstance(chosen, Refusal):
                    return (failure or Failure.refused(chosen)).send(ctx.out)
            replica = chosen
            result = await self.attempt(ctx, replica)
            if result is None:
                return
            failure = result
            if result.final:
                break
            attempts += 1
            if not result.again:
                tried = (*tried, replica)
            if attempts >= max_attempts:
                break
            replica.m_retries.inc()
        assert failure is not None
        failure.send(ctx.out)

    def _read_timeout_s(self, t0_s: float) -> float:
        limits = self.limits
        if limits.total_timeout_s is None:
            return limits.read_timeout_s
        left_s = t0_s + limits.total_timeout_s - time.monotonic()
        if left_s <= 0:
            raise UpstreamTimeout("the request ran past limits.total_timeout_s")
        return min(limits.read_timeout_s, left_s)

    async def _open(self, replica: Replica, data: bytes, t0_s: float) -> UpstreamResponse:
        """Send and wait for the response head. A kept-alive connection the replica had
        already closed is retried once on a fresh one, without blaming the replica."""
        pool = self._pool()
        assert pool is not None
        up = await pool.send(replica.addr, data)
        try:
            await up.headers(self._read_timeout_s(t0_s))
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
            await up.headers(self._read_timeout_s(t0_s))
        except BaseException:
            up.release()
            raise
        return up

    # -- one attempt on one replica -------------------------------------------------------
    async def attempt(self, ctx: RequestContext, replica: Replica) -> Failure | None:
        """One try on one replica: None once a response went out, or a Failure before."""
        fleet = self.fleet
        fleet.started(ctx.info, replica, ctx.policy)
        replica.m_requests.inc()
        ok = ctx.streamed = False
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
                upstream = await self._open(replica, data, ctx.t0_s)
            except UpstreamTimeout:
                replica.m_errors.inc()
                return Failure(504, f"replica {replica.replica_id} did not answer in time",
                               final=True)  # fmt: skip
            except UpstreamError as exc:
                return self._failed(replica, 502, f"replica {replica.replica_id} failed: {exc}")
            try:
                status = upstream.status
                ctype = upstream.content_type.decode("latin-1") or JSON
                if status == 200 and ctype.startswith("text/event-stream"):
                    result, ok = await self._stream(ctx, upstream, replica)
                    return result
                try:
                    body = await upstream.read_all(self._read_timeout_s(ctx.t0_s))
                except UpstreamTimeout:
                    replica.m_errors.inc()
                    return Failure(504, f"replica {replica.replica_id} timed out", final=True)
                except UpstreamError as exc:
                    return self._failed(replica, 502, f"replica {replica.replica_id} broke: {exc}")
                if status >= 500:
                    return self._failed(replica, status, "", body, ctype)
                if status == 404 and info.adapter is not None:
                    # It lost the adapter (restarted?): load it again and resend.
                    fleet.adapter_forgotten(replica, info.adapter)
                    return Failure(404, "", body=body, content_type=ctype, again=True)
                ok = status < 400
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
            fleet.finished(ctx.info, replica, ctx.policy, ok, ctx.streamed)

    def _failed(
        self, replica: Replica, status: int, message: str, body: bytes | None = None,
        ctype: str = JSON,
    ) -> Failure:  # fmt: skip
        replica.m_errors.inc()
        self.fleet.table.record_failure(replica)
        return Failure(status, message, body=body, content_type=ctype)

    async def _stream(
        self, ctx: RequestContext, upstream: UpstreamResponse, replica: Replica
    ) -> tuple[Failure | None, bool]:
        """Forward SSE chunks as they arrive. Returns (failure before any byte, clean end)."""
        try:
            first = await upstream.read_chunk(self._read_timeout_s(ctx.t0_s))
        except UpstreamTimeout:
            replica.m_errors.inc()
            return Failure(504, f"replica {replica.replica_id} timed out", final=True), False
        except UpstreamError as exc:
            return self._failed(replica, 502, f"replica {replica.replica_id} broke: {exc}"), False
        if not first:
            return self._failed(replica, 502, f"replica {replica.replica_id} sent no data"), False
        ttft_s = time.monotonic() - ctx.t0_s
        self.fleet.first_token(ctx.info, replica, ctx.policy)
        ctx.streamed = True
        return None, await self._stream_rest(ctx, upstream, replica, first, ttft_s)

    async def _stream_rest(
        self,
        ctx: RequestContext,
        upstream: UpstreamResponse,
        replica: Replica,
        first: bytes,
        ttft_s: float,
    ) -> bool:
        out = ctx.out
        t0_s = ctx.t0_s
        await out.start_stream(200, "text/event-stream")
        itl = self.metrics.latency(ctx.model, ctx.tenant.name)[2]
        chunk = first
        tail = first
        events = 0
        last_s = t0_s + ttft_s
        broken: str | None = None
        while True:
            events += chunk.count(b"data:")
            await out.write(chunk)  # a gone client raises here; release() resets upstream
            try:
                chunk = await upstream.read_chunk(self._read_timeout_s(t0_s))
            except UpstreamTimeout:
                broken = "the replica stopped sending (read timeout)"
                break
            except UpstreamError as exc:
                broken = f"the replica's stream broke: {exc}"
                break
            if not chunk:
                if not tail.rstrip().endswith(_DONE_TAIL):
                    broken = "the replica's stream ended without [DONE]"
                break
            now_s = time.monotonic()
            itl.observe(now_s - last_s)
            last_s = now_s
            tail = chunk if len(chunk) >= 16 else tail[-16:] + chunk
        now_s = time.monotonic()
        if broken is not None:
            replica.m_errors.inc()
            self.fleet.table.record_failure(replica)
            sep = b"" if tail.endswith(b"\n\n") else b"\n\n"
            await out.write(sep + sse_error_event(f"upstream error: {broken}", 502))
        else:
            self.fleet.table.record_success(replica)
            # Events minus the [DONE] marker approximate the tokens streamed.
            self.metrics.observe_stream(ctx.model, ctx.tenant.name, ttft_s, now_s - t0_s,
                                        max(1, events - 1), now_s)  # fmt: skip
        await out.end()
        return broken is None
