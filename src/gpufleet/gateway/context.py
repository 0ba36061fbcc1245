"""One completion request as the proxy carries it through its attempts, and a failed
attempt before any byte reached the client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.fleet_state import Refusal
from gpufleet.gateway.continuation import Transcript
from gpufleet.gateway.http_adapters import JSON, Out
from gpufleet.gateway.tenants import Tenant
from gpufleet.openai_errors import error_json_bytes
from gpufleet.routing.types import RequestInfo, RoutingPolicy

if TYPE_CHECKING:
    from gpufleet.gateway.failover import FailoverPlan


class Failure:
    """A failed attempt before any byte reached the client: retry elsewhere or report.

    `final` failures (timeouts) are not retried: the request may still be running there.
    """

    __slots__ = ("again", "body", "code", "content_type", "final", "headers", "message",
                 "mid_generation", "param", "status")  # fmt: skip

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
        self.mid_generation = False  # the replica had the request and broke while on it

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

    __slots__ = ("body", "chat", "events", "failover", "headers", "info", "model", "ok",
                 "out", "path", "policy", "request", "streamed", "t0_s", "tenant",
                 "transcript", "ttft_s")  # fmt: skip

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
        request: dict[str, Any],
        failover: FailoverPlan | None,
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
        self.request = request  # the body as parsed (a resumed request is built from it)
        self.chat = path.endswith("chat/completions")
        self.failover = failover  # None: a broken stream ends with an error event
        self.streamed = False  # the current attempt's first chunk reached the client
        self.ok = False  # the current attempt ended cleanly
        self.ttft_s: float | None = None  # of the first attempt that streamed
        self.events = 0  # SSE events relayed, every attempt together
        self.transcript: Transcript | None = None  # what the client was sent, once streaming
