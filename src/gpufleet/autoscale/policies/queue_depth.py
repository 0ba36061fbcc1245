"""`queue_depth`: the seeds' rule — desired = ceil(pending / per-replica capacity).

Per-replica capacity is how many sequences one replica batches at once (the plan's
concurrent sequences for the layout when known, else vLLM's max_num_seqs). No memory, no
delays: it is the reference the others are measured against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpufleet.autoscale.decision import (
    ReplicaBounds,
    ScalingDecision,
    capacity_note,
    check_capacity_per_replica,
)
from gpufleet.autoscale.signals import FleetSignals


@dataclass(slots=True)
class QueueDepthPolicy:
    bounds: ReplicaBounds = field(default_factory=ReplicaBounds)
    capacity_per_replica: int = 256
    # Where capacity_per_replica came from, in words (shown in every reason).
    capacity_source: str = ""
    name: str = "queue_depth"

    def __post_init__(self) -> None:
        check_capacity_per_replica(self.capacity_per_replica)

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision:
        pending = signals.demand
        raw = math.ceil(pending / self.capacity_per_replica)
        desired = self.bounds.clamp(raw)
        reason = (
            f"pending {pending} / capacity {self.capacity_per_replica} per replica"
            + capacity_note(self.capacity_source)
            + f" → {raw}, within [{self.bounds.min_replicas}, {self.bounds.max_replicas}] → {desired}"
        )
        return ScalingDecision(desired, reason, self.name, now_s, signals.current_replicas)
