"""Route to the replica with the least engine-reported work (vLLM /metrics)."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.routing.base import PolicyBase, random_min
from gpufleet.routing.load import KV_FULL_AS_REQUESTS, WAITING_WEIGHT, queue_depth_score
from gpufleet.routing.types import ReplicaView, RequestInfo


class QueueDepth(PolicyBase):
    """Scores vllm:num_requests_waiting / _running / kv_cache_usage_perc from the last
    scrape, corrected by this gateway's in-flight change since that scrape; lowest wins,
    random among ties."""

    name = "queue_depth"

    def __init__(
        self,
        *,
        seed: int | None = None,
        waiting_weight: float = WAITING_WEIGHT,
        kv_full_as_requests: float = KV_FULL_AS_REQUESTS,
    ) -> None:
        super().__init__(seed=seed)
        self.waiting_weight = waiting_weight
        self.kv_full_as_requests = kv_full_as_requests

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        return random_min(
            self.rng,
            replicas,
            lambda r: queue_depth_score(
                r,
                waiting_weight=self.waiting_weight,
                kv_full_as_requests=self.kv_full_as_requests,
            ),
        )
