"""How loaded a replica is, from the gateway's counts and the replica's last scrape."""

from __future__ import annotations

from gpufleet.routing.types import ReplicaView

# A replica whose KV cache is full will queue the next request; weigh its usage as this
# many extra requests so a nearly-full replica loses to an equally busy emptier one.
KV_FULL_AS_REQUESTS = 4.0
# A waiting request costs more than a running one: it has not even started its prefill.
WAITING_WEIGHT = 2.0


def in_flight(replica: ReplicaView) -> int:
    """Requests in flight on `replica` from this gateway: its own and its peer workers'."""
    return replica.in_flight + replica.peer_in_flight


def awaiting_first_token(replica: ReplicaView) -> int:
    """Of this gateway's requests on `replica`, those whose first token has not come back:
    prompts it still has to prefill (or queues). Peers' requests are not split so."""
    return max(0, replica.in_flight - replica.streaming)


def requests_since_scrape(replica: ReplicaView) -> int:
    """Requests sent (positive) or finished (negative) since the scrape, per this gateway."""
    if replica.stats is None:
        return 0
    return in_flight(replica) - replica.stats.in_flight_at_scrape


def running_and_waiting(replica: ReplicaView) -> tuple[int, int] | None:
    """The engine's running and waiting requests at its last scrape, corrected by what this
    gateway sent or saw finish since; None without a scrape."""
    stats = replica.stats
    if stats is None:
        return None
    delta = requests_since_scrape(replica)
    running = stats.num_running
    waiting = stats.num_waiting
    if delta >= 0:
        # New requests join the queue if there is one, otherwise they start running.
        if waiting > 0:
            waiting += delta
        else:
            running += delta
    else:
        # Finished requests leave the running set; the queue refills it.
        gone = -delta
        running = max(0, running - gone)
        refill = min(waiting, gone)
        waiting -= refill
        running += refill
    return running, waiting


def queue_depth_score(
    replica: ReplicaView,
    *,
    waiting_weight: float = WAITING_WEIGHT,
    kv_full_as_requests: float = KV_FULL_AS_REQUESTS,
) -> float:
    """Engine-reported running + waiting + KV pressure, corrected by what this gateway sent
    or saw finish since the scrape. Without a scrape, the gateway's in-flight count."""
    counts = running_and_waiting(replica)
    if counts is None or replica.stats is None:
        return float(in_flight(replica))
    running, waiting = counts
    return running + waiting_weight * waiting + kv_full_as_requests * replica.stats.kv_cache_usage
