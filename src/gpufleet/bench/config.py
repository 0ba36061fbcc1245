"""What to run: target, arrivals, workload, SLOs. Validated with errors naming the flag."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gpufleet.errors import UserError
from gpufleet.stats import DEFAULT_PERCENTILES

DEFAULT_NUM_REQUESTS = 1000
# Cap on the requests of a timed run, so no loop is unbounded even at rate=inf.
TIMED_RUN_MAX_REQUESTS = 1_000_000


@dataclass
class BenchConfig:
    """One benchmark run. Field names follow the CLI flags (`--input-tokens` → input_tokens)."""

    url: str
    model: str | None = None  # None: the first model of GET /v1/models
    endpoint: Literal["completions", "chat"] = "completions"
    api_key: str | None = None
    # arrivals
    rate: float = math.inf  # requests (or sessions) per second; inf sends all at once
    burstiness: float = 1.0
    concurrency: int | None = None  # closed loop: this many requests always in flight
    max_concurrency: int | None = None  # open loop cap
    ramp: tuple[float, float] | None = None  # linear rate ramp (start, end) across the run
    num_requests: int | None = None
    duration_s: float | None = None
    # workload
    input_tokens: int = 1024
    output_tokens: int = 128
    range_ratio: float = 0.0
    trace: str | None = None
    trace_format: Literal["auto", "azure", "mooncake"] = "auto"
    speedup: float = 1.0  # trace replay speed (2 = twice as fast)
    prefix_groups: int | None = None
    prefix_tokens: int = 0
    sessions: int | None = None
    turns: int = 1
    # request options
    ignore_eos: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0
    warmup_requests: int = 0  # sent and discarded before the measured run
    # reporting
    goodput_slo_ms: dict[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    seed: int = 0
    scrape_metrics: bool = True
    extra_metrics_urls: tuple[str, ...] = ()  # also scraped, e.g. the replicas behind a gateway
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["api_key"] = "***" if self.api_key else None
        for k in ("rate", "burstiness"):
            if math.isinf(out[k]):
                out[k] = "inf"
        return out

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    def validate(self) -> BenchConfig:
        """Raise UserError naming the flag for the first inconsistent setting."""

        def bad(flag: str, message: str, fix: str) -> UserError:
            return UserError(message, field=flag, fix=fix)

        if not self.url.startswith(("http://", "https://")):
            raise bad("--url", f"{self.url!r} is not an http(s) URL", "e.g. http://127.0.0.1:8000")
        if self.endpoint not in ("completions", "chat"):
            raise bad("--endpoint", f"unknown endpoint {self.endpoint!r}", "completions or chat")
        if not self.rate > 0:
            raise bad("--rate", "must be positive", "requests per second, or inf")
        if not self.burstiness > 0:
            raise bad(
                "--burstiness", "must be positive", "1 for Poisson, <1 burstier, inf constant"
            )
        for flag, value in (
            ("--concurrency", self.concurrency),
            ("--max-concurrency", self.max_concurrency),
        ):
            if value is not None and value < 1:
                raise bad(flag, "must be at least 1", "a positive number of requests in flight")
        if self.concurrency is not None and (not math.isinf(self.rate) or self.ramp):
            raise bad(
                "--concurrency",
                "a closed loop at fixed concurrency cannot also have an arrival rate",
                "use --concurrency alone, or --rate with --max-concurrency",
            )
        if self.ramp is not None:
            if min(self.ramp) <= 0 or any(math.isinf(r) for r in self.ramp):
                raise bad("--ramp", "rates must be positive and finite", "e.g. --ramp 1:20")
            if self.num_requests is None:
                raise bad("--ramp", "a ramp needs a request count", "add --num-requests N")
        if self.num_requests is not None and self.num_requests < 1:
            raise bad("--num-requests", "must be at least 1", "a positive count")
        if self.duration_s is not None and not self.duration_s > 0:
            raise bad("--duration", "must be positive", "seconds")
        if (
            self.duration_s is not None
            and self.num_requests is None
            and math.isinf(self.rate)
            and self.concurrency is None
            and self.ramp is None
            and not self.trace
        ):
            raise bad(
                "--duration",
                "a timed run at rate=inf would send without bound",
                "add --rate R or --concurrency C (or --num-requests N)",
            )
        if self.input_tokens < 0 or self.output_tokens < 1:
            raise bad(
                "--output-tokens",
                "token counts must be >= 1",
                "e.g. --input-tokens 1024 --output-tokens 128",
            )
        if self.input_tokens < 1 and not (self.prefix_groups and self.prefix_tokens > 0):
            raise bad("--input-tokens", "must be at least 1", "e.g. --input-tokens 1024")
        if not 0.0 <= self.range_ratio < 1.0:
            raise bad("--range-ratio", "must be in [0, 1)", "e.g. 0.2 for ±20%")
        kinds = [
            k
            for k, on in (
                ("--trace", bool(self.trace)),
                ("--sessions", self.sessions is not None),
                ("--prefix-groups", self.prefix_groups is not None),
            )
            if on
        ]
        if len(kinds) > 1:
            raise bad(kinds[1], f"cannot combine {' and '.join(kinds)}", "choose one workload")
        if self.trace and (not math.isinf(self.rate) or self.ramp is not None):
            raise bad(
                "--rate" if self.ramp is None else "--ramp",
                "a trace is replayed at its own timestamps",
                "drop --rate/--ramp; use --speedup to replay faster or slower",
            )
        if self.prefix_groups is not None and self.prefix_groups < 1:
            raise bad("--prefix-groups", "must be at least 1", "a positive number of groups")
        if self.prefix_tokens < 0:
            raise bad("--prefix-tokens", "must be >= 0", "tokens of shared prefix per group")
        if self.sessions is not None and self.sessions < 1:
            raise bad("--sessions", "must be at least 1", "a positive number of sessions")
        if self.turns < 1:
            raise bad("--turns", "must be at least 1", "turns per session")
        if not self.speedup > 0:
            raise bad("--speedup", "must be positive", "1 replays at the trace's own pace")
        for u in self.extra_metrics_urls:
            if not u.startswith(("http://", "https://")):
                raise bad(
                    "--metrics-url", f"{u!r} is not an http(s) URL", "e.g. http://127.0.0.1:8001"
                )
        if self.warmup_requests < 0:
            raise bad("--warmup", "must be >= 0", "a number of requests")
        if not self.timeout_s > 0:
            raise bad("--timeout", "must be positive", "seconds per request")
        for p in self.percentiles:
            if not 0 <= p <= 100:
                raise bad("--percentiles", f"{p} is not in [0, 100]", "e.g. 50,90,99")
        return self
