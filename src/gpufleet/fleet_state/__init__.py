"""gpufleet.fleet_state: the pure fleet core between routing policies and drivers.

The replica table and its states, eligibility per model and tenant pool, in-flight counts,
the admission queue, scraped engine metrics, policy notifications and the typed signal
snapshot for autoscaling. The gateway drives it with sockets and the real clock, the
simulator with a virtual clock (docs/design.md).
"""

from gpufleet.fleet_state.adapters import AdapterCatalog, AdapterSpec, can_serve_adapter
from gpufleet.fleet_state.engine_metrics import (
    ENGINE_METRICS,
    KV_USAGE_RULE,
    EngineMetricNames,
    ScrapedMetrics,
    parse_engine_metrics,
)
from gpufleet.fleet_state.latency import LatencyWindows, RecentWindow
from gpufleet.fleet_state.lora_metrics import LoraRequestsInfo
from gpufleet.fleet_state.queue import AdmissionQueue, QueueTicket, Refusal
from gpufleet.fleet_state.replica import FleetReplica
from gpufleet.fleet_state.signals import GatewaySignals, LatencyPercentiles, ReplicaSnapshot
from gpufleet.fleet_state.state import FleetState, needs_prefix_hashes
from gpufleet.fleet_state.table import ReplicaTable

__all__ = [
    "ENGINE_METRICS",
    "KV_USAGE_RULE",
    "AdapterCatalog",
    "AdapterSpec",
    "AdmissionQueue",
    "EngineMetricNames",
    "FleetReplica",
    "FleetState",
    "GatewaySignals",
    "LatencyPercentiles",
    "LatencyWindows",
    "LoraRequestsInfo",
    "QueueTicket",
    "RecentWindow",
    "Refusal",
    "ReplicaSnapshot",
    "ReplicaTable",
    "ScrapedMetrics",
    "can_serve_adapter",
    "needs_prefix_hashes",
    "parse_engine_metrics",
]
