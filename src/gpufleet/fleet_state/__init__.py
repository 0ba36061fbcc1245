"""gpufleet.fleet_state: the pure fleet core between routing policies and drivers.

The replica table and its states, eligibility per model and tenant pool, tenants' rate
and concurrency limits, in-flight counts, the admission queue, scraped engine metrics, policy notifications and the typed signal
snapshot for autoscaling. The gateway drives it with sockets and the real clock, the
simulator with a virtual clock (docs/design.md).
"""

from gpufleet.fleet_state.adapters import AdapterCatalog, AdapterSpec, can_serve_adapter
from gpufleet.fleet_state.engine_detect import EngineIdentity, identify
from gpufleet.fleet_state.engine_metrics import KV_USAGE_RULE, ScrapedMetrics, parse_engine_metrics
from gpufleet.fleet_state.engine_names import (
    ENGINE_METRICS,
    ENGINES,
    EngineMetricNames,
    metric_names,
)
from gpufleet.fleet_state.latency import LatencyWindows, RecentWindow
from gpufleet.fleet_state.lora_metrics import LoraRequestsInfo
from gpufleet.fleet_state.outlier import OutlierConfig
from gpufleet.fleet_state.peers import PeerEvents
from gpufleet.fleet_state.policy_kinds import LearnsFromPeers
from gpufleet.fleet_state.queue import AdmissionQueue, QueueLimits, QueueTicket, Refusal
from gpufleet.fleet_state.replica import FleetReplica
from gpufleet.fleet_state.signals import (
    GatewaySignals,
    LatencyPercentiles,
    ModelLatency,
    ReplicaSnapshot,
    merge_signals,
)
from gpufleet.fleet_state.state import (
    LOAD_FROM_ENGINE,
    LOAD_FROM_IN_FLIGHT,
    FleetState,
    needs_prefix_hashes,
)
from gpufleet.fleet_state.table import ReplicaTable
from gpufleet.fleet_state.tenant_limits import TenantLimits, TokenBucket

__all__ = [
    "ENGINES",
    "ENGINE_METRICS",
    "KV_USAGE_RULE",
    "LOAD_FROM_ENGINE",
    "LOAD_FROM_IN_FLIGHT",
    "AdapterCatalog",
    "AdapterSpec",
    "AdmissionQueue",
    "EngineIdentity",
    "EngineMetricNames",
    "FleetReplica",
    "FleetState",
    "GatewaySignals",
    "LatencyPercentiles",
    "LatencyWindows",
    "LearnsFromPeers",
    "LoraRequestsInfo",
    "ModelLatency",
    "OutlierConfig",
    "PeerEvents",
    "QueueLimits",
    "QueueTicket",
    "RecentWindow",
    "Refusal",
    "ReplicaSnapshot",
    "ReplicaTable",
    "ScrapedMetrics",
    "TenantLimits",
    "TokenBucket",
    "can_serve_adapter",
    "identify",
    "merge_signals",
    "metric_names",
    "needs_prefix_hashes",
    "parse_engine_metrics",
]
