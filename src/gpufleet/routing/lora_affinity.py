"""LoRA adapter affinity with bounded loads: a request for an adapter goes where the adapter
already is, unless that replica is overloaded. A layer over any other policy.

A request for an adapter may run on any replica of its base model: where the adapter is
not registered the gateway loads it first (vLLM `POST /v1/load_lora_adapter`), and where
it is registered but not in a GPU slot the engine loads it at admission, stalling the
batch (tens of ms from disk, ms from the CPU cache). And a replica runs at most
`max_lora` distinct adapters in one batch (vLLM's `--max-loras`): a request whose adapter
would be one too many waits until some adapter's requests are all done. So each eligible
replica gets a tier, best first:

0. the adapter is in use there (requests running or waiting with it, as this gateway sent
   them or as the last scrape of `vllm:lora_requests_info` says): no load, no new slot;
1. it was among the replica's last `max_lora` adapters (likely still in a GPU slot) and a
   slot is free;
2. it is registered there (maybe only on disk or in the CPU cache) and a slot is free;
3. it is not registered there (the gateway must load it) and a slot is free;
4. every slot is taken by other adapters in use: the request would queue for one.

Among the replicas within the load bound it takes the best tier, and lets the inner policy
(least outstanding by default; prefix_aware works too) choose inside that tier. The bound
is consistent hashing with bounded loads' (as `prefix_aware`): load + 1 <=
max(load_factor x mean, mean + load_slack), the mean counting this request. A hot adapter
whose replicas are all at the bound spills to the best other replica, which then holds it
too: an adapter is copied onto as many replicas as its traffic needs, one load each.
Requests for the base model go to the inner policy unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from gpufleet.routing.base import PolicyBase
from gpufleet.routing.load import in_flight, queue_depth_score
from gpufleet.routing.types import ReplicaView, RequestInfo, RoutingPolicy

LOAD_SIGNALS = ("in_flight", "queue_depth")
TIER_IN_USE, TIER_WARM, TIER_REGISTERED, TIER_ABSENT, TIER_SLOTS_FULL = range(5)


class LoraAffinity(PolicyBase):
    name = "lora_affinity"

    def __init__(
        self,
        *,
        seed: int | None = None,
        inner: str = "least_outstanding",
        inner_options: dict[str, Any] | None = None,
        load_factor: float = 1.5,
        load_slack: float = 2.0,
        max_loras: int = 1,
        load: str = "in_flight",
    ) -> None:
        super().__init__(seed=seed)
        from gpufleet.routing.registry import make_policy  # the registry imports this module

        if inner == self.name:
            raise ValueError("inner must be another policy than lora_affinity")
        if load_factor < 1.0 or load_slack < 1.0:
            raise ValueError("load_factor and load_slack must be >= 1.0")
        if max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if load not in LOAD_SIGNALS:
            raise ValueError(f"load must be one of {LOAD_SIGNALS}, not {load!r}")
        self.inner: RoutingPolicy = make_policy(inner, seed=seed, **(inner_options or {}))
        self.uses_prefix_hashes = bool(getattr(self.inner, "uses_prefix_hashes", False))
        self.load_factor = load_factor
        self.load_slack = load_slack
        self.max_loras = max_loras  # assumed until a replica's scrape says its max_lora
        self.load_signal = load
        # replica -> adapter -> requests this gateway sent there and has not seen finish
        self._in_use: dict[str, dict[str, int]] = {}
        # replica -> adapters routed there, the most recent last (its GPU slots' LRU order)
        self._recent: dict[str, OrderedDict[str, None]] = {}

    # -- choosing -------------------------------------------------------------------------
    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        adapter = request.adapter
        if adapter is None or len(replicas) <= 1:
            chosen = self.inner.choose(request, replicas)
        else:
            chosen = self.inner.choose(request, self.best_tier(adapter, replicas))
        if adapter is not None and chosen is not None:
            self._touch(chosen.replica_id, adapter)
        return chosen

    def best_tier(self, adapter: str, replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
        """The replicas within the load bound that share the best tier for `adapter`."""
        loads = [self._load(r) for r in replicas]
        mean = (sum(loads) + 1.0) / len(replicas)
        cap = max(self.load_factor * mean, mean + self.load_slack)
        best: list[ReplicaView] = []
        best_tier = TIER_SLOTS_FULL + 1
        for replica, load in zip(replicas, loads, strict=True):
            if load + 1.0 > cap:
                continue
            tier = self.tier(adapter, replica)
            if tier < best_tier:
                best, best_tier = [replica], tier
            elif tier == best_tier:
                best.append(replica)
        # load_slack >= 1 keeps the least loaded replica within the bound
        return best or list(replicas)

    def tier(self, adapter: str, replica: ReplicaView) -> int:
        """How ready `replica` is to run `adapter` now (the module doc's tiers, 0 best)."""
        in_use = self.adapters_in_use(replica)
        if adapter in in_use:
            return TIER_IN_USE
        max_lora = self._max_lora(replica)
        if len(in_use) >= max_lora:
            return TIER_SLOTS_FULL
        recent = self._recent.get(replica.replica_id)
        if recent is not None and adapter in list(recent)[-max_lora:]:
            return TIER_WARM
        return TIER_REGISTERED if adapter in replica.models else TIER_ABSENT

    def adapters_in_use(self, replica: ReplicaView) -> set[str]:
        """Adapters with requests on `replica`: this gateway's, and other gateways' as the
        last scrape reported them."""
        mine = self._in_use.get(replica.replica_id)
        in_use = set(mine) if mine else set()
        stats = replica.stats
        if stats is not None:
            in_use.update(stats.running_adapters)
            in_use.update(stats.waiting_adapters)
        return in_use

    def _max_lora(self, replica: ReplicaView) -> int:
        stats = replica.stats
        if stats is not None and stats.max_lora:
            return stats.max_lora
        return self.max_loras

    def _load(self, replica: ReplicaView) -> float:
        if self.load_signal == "queue_depth":
            return queue_depth_score(replica)
        return float(in_flight(replica))

    def _touch(self, replica_id: str, adapter: str) -> None:
        recent = self._recent.setdefault(replica_id, OrderedDict())
        recent[adapter] = None
        recent.move_to_end(adapter)
        while len(recent) > 64:  # more than any replica's GPU slots
            recent.popitem(last=False)

    # -- notifications --------------------------------------------------------------------
    def on_started(self, request: RequestInfo, replica: ReplicaView) -> None:
        if request.adapter is not None:
            counts = self._in_use.setdefault(replica.replica_id, {})
            counts[request.adapter] = counts.get(request.adapter, 0) + 1
        self.inner.on_started(request, replica)

    def on_first_token(self, request: RequestInfo, replica: ReplicaView) -> None:
        self.inner.on_first_token(request, replica)

    def on_finished(self, request: RequestInfo, replica: ReplicaView, ok: bool) -> None:
        adapter = request.adapter
        counts = self._in_use.get(replica.replica_id)
        if adapter is not None and counts is not None and adapter in counts:
            counts[adapter] -= 1
            if counts[adapter] <= 0:
                del counts[adapter]
                self._touch(replica.replica_id, adapter)  # its last use, for the LRU order
        self.inner.on_finished(request, replica, ok)

    def on_replica_removed(self, replica_id: str) -> None:
        self._in_use.pop(replica_id, None)
        self._recent.pop(replica_id, None)
        self.inner.on_replica_removed(replica_id)

    def set_capacity_tokens(self, replica_id: str, tokens: int) -> None:
        """Passed on to an inner policy that sizes its state by KV capacity."""
        setter = getattr(self.inner, "set_capacity_tokens", None)
        if setter is not None:
            setter(replica_id, tokens)
