"""One replica as the fleet core tracks it: what a router sees, plus health bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.native import mypyc_attr
from gpufleet.routing.types import ReplicaView


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: the gateway's `Replica` is not)
@dataclass(slots=True, eq=False)
class FleetReplica(ReplicaView):
    """A `ReplicaView` (what policies read) with what the core needs besides.

    Drivers may subclass it for their own per-replica data (the gateway keeps its
    connection address and Prometheus counters there). Compared by identity.
    """

    fixed_models: bool = False  # models were configured, not learned from /v1/models
    consecutive_failures: int = 0  # failed requests in a row (outlier detection)
    consecutive_successes: int = 0  # passing probes in a row
    failed_probes: int = 0  # failed health probes in a row (active health checking)
    healthy: bool = True  # the active health checks' verdict
    ejected_until_s: float | None = None  # ejected by outlier detection until then
    ejections: int = 0  # the ejection-time multiplier (see fleet_state.outlier)
    window_requests: int = 0  # requests finished in this success-rate interval
    window_failures: int = 0
    kv_capacity_tokens: int | None = None  # from the engine's metrics, when it reports it
    down_reason: str = ""  # why the last probe failed ("" once healthy), as a person reads it
    engine: str | None = None  # vllm | sglang | tgi | trtllm | openai; None: not known yet
    engine_source: str = ""  # "config", "/metrics names", "/v1/models owned_by", ...
    # Where its load comes from: "engine" (its /metrics), "in_flight" (the gateway's own
    # counts: the engine exposes no load metrics); None: not scraped yet.
    load_signals: str | None = None
    load_note: str = ""  # why it is routed by in-flight counts, as a person reads it
    # LoRA: whether it loads adapters at runtime (None: not known yet), why not, and how
    # many adapters were loaded onto it for this fleet.
    lora_loadable: bool | None = None
    lora_note: str = ""
    adapter_loads: int = 0

    def serves(self, model: str) -> bool:
        # A replica whose models are not known yet (no /v1/models) is offered none.
        return model in self.models
