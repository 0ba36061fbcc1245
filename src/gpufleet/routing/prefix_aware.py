"""Prefix-aware routing with bounded loads: cache hits without herding.

For each request the policy looks up, in its `PrefixIndex`, how many leading prompt
blocks each eligible replica is believed to hold. Among the replicas that are not
overloaded it picks the one with the lowest estimated time to first token, counted in
blocks of prefill:

    cost = prefill still pending on the replica + miss_weight x blocks it would not hit
           + share_weight x its share past the mean

The share term is by default (`share="requests_and_cold_blocks"`) the request share,
plus, for prompts no allowed replica holds any of, the blocks they would write on top of
the replica's churn past the mean: a prefix survives in an LRU cache for about capacity /
churn, so even churn gives every replica the same horizon, as one pooled cache has.
Counting requests alone (`"requests"`) sends new prompts away from the holder of the
hottest prefix, which takes mostly hits; the other replicas write more and evict sooner
(system_prompts@1: prefill max/mean 1.20, 1.2% of the pooled engine's hits evicted on
the chosen replica). Such a prompt loses nothing by moving, so it is held to
balance_factor x the mean request count without the slack: the churn term alone put the
new groups on the hot holder early and its matches then carried it past 1.10 (1.112 on
system_prompts@0). benchmarks/results/routing_replay_seeds.md and docs/routing.md have
the tables. `"new_blocks"` (churn for every prompt) and `"cold_blocks"` (churn only, for
new prompts) even the churn further but break the 1.10 balance (up to 1.26 and 1.13).

"Pending" is this policy's own bookkeeping (added when it routes, removed on the first
token or the finish), so a replica with a long prefill queue loses a request whose match
is short, while a long match is still worth a wait; `miss_weight` > 1 charges a miss for
the work it adds to the fleet, not just to this request. With empty queues this is
simply the longest match. "Overloaded" is two bounds, in the spirit of consistent hashing
with bounded loads (Mirrokni et al.):

- in flight: load + 1 <= max(inflight_factor x mean, mean + inflight_slack), the mean
  counting this request; it stops a herd now (the slack is generous: a decode batch a
  few sequences longer costs little, a spilled match costs its whole prefill; 8 of a
  256-sequence batch, the same share of the replicas' `batch_size` when known);
- recent share: a replica's count of the last ~`window_requests` decisions (decayed per
  decision, not per second: no clock) <= max(balance_factor x mean, mean +
  balance_slack); it keeps the long-run split even, which in-flight counts alone do not
  when requests differ in length.

Both bounds stretch for a replica by `match_headroom` x the share of this prompt it holds
(1.5x for a whole-prompt match at the default 0.5): moving a request off its holder
recomputes that share and copies it onto a second replica, so long matches stay home while
cold and short requests, which lose nothing by moving, do the balancing. On 12 instances of
the synthetic workloads (benchmarks/routing_replay.py, NAME@0..2) it lifts the hit rate
from 0.991x to 0.996x one pooled engine's (worst 0.985x -> 0.988x), TTFT -3%, p99 -7%,
run-long max/mean requests <= 1.072; 0.25 gains less, 1.0 no more.

A conversation's own history is not balanced by the share cost (`keep_history`): when a
replica holds this prompt past the deepest block where prompts branch (`PrefixIndex.
shared_depth`: past the system prompt or agent tools other prompts share), it pays the
share cost only past the share bound. Moving a conversation recomputes its history, which
nothing else reuses, while a new conversation moves for the price of its shared prefix at
most (once per replica) and takes its later turns with it; so new conversations do the
balancing and histories stay home. Over the 12 synthetic instances it lifts the hit rate
from 0.9955x to 0.9964x one pooled engine's (multi_turn@1 0.994x -> 0.996x, tool_agent@1
0.996x -> 0.998x with TTFT -4%, p99 -11%), the Mooncake slice 1.085x -> 1.141x, worst
max/mean requests 1.092 -> 1.096; what still moves is first turns copying a system prompt.

A holder of a rare, one-shot shared prefix pays less share cost (`rare_share_floor`):
moving one of its prompts relieves one request and copies the prefix for few later uses,
while a hot prefix's copy serves many, so the balancing is left to the hot prefixes and
new prompts. `PrefixUses` counts, per shared prefix, its prompts and those continuing a
conversation; the share cost is scaled by 1 - (1 - the share of one replica's traffic the
prefix carries) x (1 - continuations per conversation start) x (1 - rare_share_floor).
Behind a system prompt that starts conversations a new prompt brings its later turns
along, so those prefixes are balanced as before. On system_prompts (3 seeds) it keeps the
rare groups the share cost spilled off the hot holder (held elsewhere 0.0023 -> 0.0002 of
the pooled engine's hits): 0.990 -> 0.992x the pooled LRU (1.000x the pooled engine),
max/mean requests 1.076 -> 1.088 (<= 1.092 per run); multi_turn, tool_agent and the
Mooncake slice unchanged. A floor of 0 reached max/mean 1.100. docs/routing.md.

A request that holds no history anywhere (cold, or a match no deeper than a shared
prefix) leaves a best guess whose engine reports requests waiting for a replica whose
engine reports none and that runs fewer requests than the mean (`idle_first`): pending
prefill counts blocks, not the wait for a batch slot, so a queue of short, well-matched
turns looked cheap while a replica just made ready idled. It needs a
scrape (without one nothing is known of slots): judged by our own pending prefill instead,
the same move copied system prompts everywhere in the replay (system_prompts@1 0.993x ->
0.949x pooled). In the simulator (benchmarks/routing_idle_first.py: a burst, 2 -> 6
replicas, 16-sequence batches) it cuts mean TTFT by 14-25 % over 3 seeds (924 -> 707,
898 -> 671, 1056 -> 905 ms), p99 unchanged (the wait before the new replicas come).

When the holder of a hot prefix hits a bound, the request goes to the allowed replica
with the best cost (the next-longest match, else the least loaded), and the index then
records the prefix there too: a hot prefix replicates onto as many replicas as its
traffic needs, each copy costing one miss, instead of one replica taking the herd.
(SGLang's cache-aware router switches the whole fleet to shortest-queue once loads differ
past a threshold, losing affinity for all traffic at once; here only the excess moves, one
request at a time.) Prompts with no known prefix are placed by pending prefill and load.
The router learns only from its own decisions (no call to a replica); pass
`capacity_tokens` (or call `set_capacity_tokens`) with what replicas report as their KV
capacity (vllm:cache_config_info num_gpu_blocks x block_size) so the index forgets what
they evict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from gpufleet.native import mypyc_attr
from gpufleet.routing.base import PolicyBase, random_min
from gpufleet.routing.load import in_flight, queue_depth_score, running_and_waiting
from gpufleet.routing.prefix import DEFAULT_BYTES_PER_TOKEN, ROUTING_BLOCK_BYTES, blocks_for_tokens
from gpufleet.routing.prefix_index import PrefixIndex
from gpufleet.routing.prefix_uses import PrefixUses
from gpufleet.routing.types import ReplicaView, RequestInfo

LOAD_SIGNALS = ("in_flight", "queue_depth")
SHARE_SIGNALS = ("requests", "new_blocks", "cold_blocks", "requests_and_cold_blocks")
MAX_TRACKED_REQUESTS = 65_536
# Requests a replica may run past the mean before a match is given up for load. A decode
# step is memory-bound (the weights are read once per step whatever the batch), so a few
# more sequences barely slow it, while a spilled request recomputes its whole match and
# copies it onto a second replica. Measured in benchmarks/routing_replay.py on tool_agent:
# a slack of 2 spilled 14 long agent contexts, 8 spills 2 (0.986x -> 0.995x the pooled
# engine, mean TTFT 127 -> 115 ms); 8 still sheds a herd (test_no_herding...). That is 8 of
# vLLM's 256-sequence batch: on replicas that batch fewer (`batch_size`), the same share
# of the batch, at least one sequence (8 of a batch of 8 queued a whole batch on the
# holder of a prefix while others idled: the demo's TTFT p99 of seconds, wave 18).
INFLIGHT_SLACK = 8.0
SLACK_BATCH = 256  # the batch INFLIGHT_SLACK was measured for (vLLM's max_num_seqs)


def inflight_slack_for(batch_size: int | None) -> float:
    """The in-flight slack for replicas batching `batch_size` sequences (None: unknown,
    vLLM's default batch assumed): INFLIGHT_SLACK / SLACK_BATCH of it, at least 1."""
    if batch_size is None:
        return INFLIGHT_SLACK
    return max(1.0, batch_size * INFLIGHT_SLACK / SLACK_BATCH)


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: sim_vs_live's is not)
class PrefixAware(PolicyBase):
    name = "prefix_aware"
    uses_prefix_hashes = True

    def __init__(
        self,
        *,
        seed: int | None = None,
        capacity_tokens: int = 262_144,
        bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN,
        block_bytes: int = ROUTING_BLOCK_BYTES,
        balance_factor: float = 1.1,
        inflight_factor: float = 2.0,
        inflight_slack: float | None = None,
        batch_size: int | None = None,
        window_requests: int = 1024,
        balance_slack: float = 8.0,
        load: str = "in_flight",
        miss_weight: float = 16.0,
        share_weight: float = 1.0,
        share: str = "requests_and_cold_blocks",
        match_headroom: float = 0.5,
        keep_history: bool = True,
        idle_first: bool = True,
        rare_share_floor: float = 0.25,
    ) -> None:
        super().__init__(seed=seed)
        if balance_factor < 1.0 or inflight_factor < 1.0:
            raise ValueError("balance_factor and inflight_factor must be >= 1.0")
        if window_requests < 1:
            raise ValueError("window_requests must be >= 1")
        if batch_size is not None and batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if load not in LOAD_SIGNALS:
            raise ValueError(f"load must be one of {LOAD_SIGNALS}, not {load!r}")
        if share not in SHARE_SIGNALS:
            raise ValueError(f"share must be one of {SHARE_SIGNALS}, not {share!r}")
        if match_headroom < 0.0:
            raise ValueError("match_headroom must be >= 0")
        if not 0.0 <= rare_share_floor <= 1.0:
            raise ValueError("rare_share_floor must be in [0, 1]")
        self.rare_share_floor = rare_share_floor
        self.match_headroom = match_headroom
        self.keep_history = keep_history
        self.idle_first = idle_first
        self.share = share
        self._churn: dict[str, float] = {}  # decayed new blocks placed per replica
        self.bytes_per_token = bytes_per_token
        self.block_bytes = block_bytes
        self.balance_factor = balance_factor
        self.inflight_factor = inflight_factor
        # Set, it wins; else a share of the replicas' batch (`inflight_slack_for`).
        self.inflight_slack = (
            inflight_slack if inflight_slack is not None else inflight_slack_for(batch_size)
        )
        self.balance_slack = balance_slack
        self.decay = 1.0 - 1.0 / window_requests
        self.uses = PrefixUses(self.decay)
        self.load_signal = load
        self.index = PrefixIndex(self._blocks(capacity_tokens))
        self._recent: dict[str, float] = {}  # decayed count of decisions per replica
        self.miss_weight = miss_weight
        self.share_weight = share_weight
        self._mean_prompt_blocks = 1.0  # decayed mean prompt length, in routing blocks
        # Prefill work (uncached blocks + 1) sent to each replica and not yet done, by this
        # policy's own bookkeeping: added on choose, removed on first token or finish.
        self._pending: dict[str, float] = {}
        self._prefill_of: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def _blocks(self, tokens: int) -> int:
        return blocks_for_tokens(
            tokens, bytes_per_token=self.bytes_per_token, block_bytes=self.block_bytes
        )

    def set_capacity_tokens(self, replica_id: str, tokens: int) -> None:
        """A replica's prefix-cache size as it reports it (e.g. num_gpu_blocks x block_size)."""
        self.index.set_capacity(replica_id, self._blocks(tokens))

    def _load(self, replica: ReplicaView) -> float:
        if self.load_signal == "queue_depth":
            return queue_depth_score(replica)
        return float(in_flight(replica))

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        if not replicas:
            return None
        n = len(replicas)
        loads = [self._load(r) for r in replicas]
        recent = [self._recent.get(r.replica_id, 0.0) for r in replicas]
        mean_load = (sum(loads) + 1.0) / n
        load_cap = max(self.inflight_factor * mean_load, mean_load + self.inflight_slack)
        mean_recent = (sum(recent) + 1.0) / n
        recent_cap = max(self.balance_factor * mean_recent, mean_recent + self.balance_slack)

        hashes = request.prefix_hashes
        ids = [r.replica_id for r in replicas]
        matches = self.index.match(hashes, ids) if hashes else dict.fromkeys(ids, 0)
        headroom = self.match_headroom / len(hashes) if hashes else 0.0

        def pressure(i: int) -> float:
            # Both bounds stretch by `match_headroom` x the share of the prompt a replica
            # holds: moving a request off its holder recomputes (and copies) that share.
            p = max((loads[i] + 1.0) / load_cap, (recent[i] + 1.0) / recent_cap)
            return p / (1.0 + headroom * matches[ids[i]])

        allowed = [i for i in range(n) if pressure(i) <= 1.0]
        if not allowed:  # everyone is over a bound: the least pressed one
            allowed = [random_min(self.rng, range(n), pressure)]

        pending = [self._pending.get(r.replica_id, 0.0) for r in replicas]
        # Being ahead of the mean share costs like prefilling `share_weight` typical prompts
        # per decision ahead: requests with little to gain from a cache (new prefixes) keep
        # away from busy holders, which leaves the share bound for long matches to use.
        share_cost = self.share_weight * self._mean_prompt_blocks
        over = [max(0.0, recent[i] + 1.0 - mean_recent) * share_cost for i in range(n)]
        if hashes:
            uncached = [len(hashes) - matches[rid] for rid in ids]
            cold = not any(matches[ids[i]] for i in allowed)
            if self.share == "requests_and_cold_blocks" and cold:
                # Its churn term pulls new prompts to the replica writing the fewest
                # blocks, usually the holder of the hottest prefix, which is ahead on
                # requests and stays ahead (its matches ride the stretched bounds). A
                # prompt that loses nothing by moving is held to the share bound itself,
                # without the slack, so it does not use up the room those matches need.
                strict = [
                    i for i in allowed if recent[i] + 1.0 <= self.balance_factor * mean_recent
                ]
                allowed = strict or allowed
                # The request share as usual, plus the blocks this prompt would write on
                # top of the replica's churn past the mean (as "cold_blocks").
                churn = [self._churn.get(r.replica_id, 0.0) for r in replicas]
                total = sum(churn)
                over = [
                    over[i]
                    + self.share_weight
                    * max(0.0, churn[i] + uncached[i] + 1.0 - (total + uncached[i] + 1.0) / n)
                    for i in range(n)
                ]
            elif self.share == "new_blocks" or (self.share == "cold_blocks" and cold):
                # Each replica's cache is an LRU: a prefix lives there about capacity /
                # (blocks written per decision). Even blocks written keep that horizon
                # the same on every replica, as in one pooled cache; even request counts
                # let the replica that took the long cold prompts evict sooner.
                churn = [self._churn.get(r.replica_id, 0.0) for r in replicas]
                total = sum(churn)
                over = [
                    self.share_weight
                    * max(0.0, churn[i] + uncached[i] + 1.0 - (total + uncached[i] + 1.0) / n)
                    for i in range(n)
                ]
            shared_end = self._count_use(hashes, matches)
            if shared_end:
                self._share_for_rare(hashes[shared_end - 1], shared_end, over, matches, ids)
            if self.keep_history and not cold:
                # A replica holding this prompt's own history (past the deepest block
                # prompts branch at) pays the share cost only past the share bound: moving
                # a conversation recomputes its history and nothing else can reuse it, so
                # the balancing is left to new conversations, which copy at most a
                # shared prefix (see the module docstring).
                shared = self.index.shared_depth(hashes, max(matches.values()))
                over = [
                    max(0.0, recent[i] + 1.0 - recent_cap) * share_cost
                    if matches[ids[i]] > shared
                    else over[i]
                    for i in range(n)
                ]
            # Estimated time to first token, in blocks of prefill: the queue ahead plus
            # this prompt's uncached part, a miss weighed extra for the work it adds.
            miss_weight = self.miss_weight

            def cost(i: int) -> tuple[float, float, float]:
                return (pending[i] + miss_weight * uncached[i] + over[i], loads[i], recent[i])

            best = random_min(self.rng, allowed, cost)
            if self.idle_first and (_waiting(replicas[best]) or 0) > 0:
                # The best guess waits in its engine's queue (a full batch: the wait is
                # for a slot, which pending prefill does not count) while a replica with
                # an empty queue and fewer requests than the mean idles (e.g. one just
                # ready). A request that holds no history anywhere copies at most a
                # shared prefix by moving: it goes to the idle one.
                deep = max(matches[ids[i]] for i in allowed)
                if deep == 0 or deep <= self.index.shared_depth(hashes, deep):
                    best = self._idle_instead(best, allowed, replicas, loads, mean_load, cost)
            work = uncached[best] + 1.0
            self._mean_prompt_blocks += (len(hashes) - self._mean_prompt_blocks) * (
                1.0 - self.decay
            )
        else:

            def plain_cost(i: int) -> tuple[float, float, float]:
                return (pending[i] + over[i], loads[i], recent[i])

            best = random_min(self.rng, allowed, plain_cost)
            if self.idle_first and (_waiting(replicas[best]) or 0) > 0:  # nothing to match: as cold
                best = self._idle_instead(best, allowed, replicas, loads, mean_load, plain_cost)
            work = 1.0
        chosen = replicas[best]
        if hashes:
            self.index.insert(chosen.replica_id, hashes)
        self._record_decision(chosen.replica_id, work)
        self._add_pending(request.request_id, chosen.replica_id, work)
        return chosen

    def _count_use(self, hashes: Sequence[int], matches: dict[str, int]) -> int:
        """Count a prompt under its shared prefix (the shared part of the deepest match
        anywhere keys it; continuing a conversation if it matched past that), the same for
        our decisions and our peers'. Its shared prefix's end in blocks (0: none)."""
        deep = max(matches.values())
        shared_end = self.index.shared_depth(hashes, deep) or deep
        if shared_end:
            self.uses.add(hashes[shared_end - 1], continues=deep > shared_end)
        return shared_end

    def _share_for_rare(
        self,
        key: int,
        shared_end: int,
        over: list[float],
        matches: dict[str, int],
        ids: list[str],
    ) -> None:
        """A holder of the shared prefix `key` (and no more of the prompt) pays the share
        cost scaled down by how rare and one-shot the prefix is, to `rare_share_floor` (see
        the module docstring)."""
        n = len(ids)
        rare = self.uses.one_shot_fill(key, n, sum(self._recent.values()) + 1.0)
        scale = 1.0 - rare * (1.0 - self.rare_share_floor)
        for i in range(n):
            if 0 < matches[ids[i]] <= shared_end:
                over[i] *= scale

    def _idle_instead(
        self,
        best: int,
        allowed: list[int],
        replicas: Sequence[ReplicaView],
        loads: list[float],
        mean_load: float,
        cost: Callable[[int], tuple[float, float, float]],
    ) -> int:
        """The best (by `cost`) allowed replica whose engine reports an empty queue and that
        runs fewer requests than the mean; `best` when there is none."""
        idle = [i for i in allowed if loads[i] + 1.0 <= mean_load and _waiting(replicas[i]) == 0]
        return random_min(self.rng, idle, cost) if idle else best

    def _record_decision(self, replica_id: str, new_blocks: float) -> None:
        self.uses.tick()
        decay = self.decay
        for rid in self._recent:
            self._recent[rid] *= decay
            self._churn[rid] = self._churn.get(rid, 0.0) * decay
        self._recent[replica_id] = self._recent.get(replica_id, 0.0) + 1.0
        self._churn[replica_id] = self._churn.get(replica_id, 0.0) + new_blocks

    def _add_pending(self, request_id: str, replica_id: str, work: float) -> None:
        self._settle(request_id)  # a retry replaces the earlier attempt
        self._prefill_of[request_id] = (replica_id, work)
        self._pending[replica_id] = self._pending.get(replica_id, 0.0) + work
        while len(self._prefill_of) > MAX_TRACKED_REQUESTS:  # lost notifications
            oldest = next(iter(self._prefill_of))
            self._settle(oldest)

    def _settle(self, request_id: str) -> None:
        entry = self._prefill_of.pop(request_id, None)
        if entry is None:
            return
        replica_id, work = entry
        if replica_id in self._pending:
            self._pending[replica_id] = max(0.0, self._pending[replica_id] - work)

    def on_peer_routed(self, replica_id: str, hashes: Sequence[int]) -> None:
        """Another worker of this gateway sent a prompt with `hashes` to `replica_id`: learn
        its blocks and count the decision in the recent share, as if it were ours (its
        prefill is counted by the peer's in-flight requests, not in our pending)."""
        work = 1.0
        if hashes:
            matches = self.index.match(hashes, {*self._recent, replica_id})
            self._count_use(hashes, matches)  # (as ours are)
            work += len(hashes) - matches[replica_id]
            self.index.insert(replica_id, hashes)
            self._mean_prompt_blocks += (len(hashes) - self._mean_prompt_blocks) * (
                1.0 - self.decay
            )
        self._record_decision(replica_id, work)

    def pending_prefill_blocks(self, replica_id: str) -> float:
        return self._pending.get(replica_id, 0.0)

    def on_first_token(self, request: RequestInfo, replica: ReplicaView) -> None:
        self._settle(request.request_id)  # its prefill is done

    def on_finished(self, request: RequestInfo, replica: ReplicaView, ok: bool) -> None:
        self._settle(request.request_id)  # failed or finished before a first token

    def on_replica_removed(self, replica_id: str) -> None:
        self.index.remove_replica(replica_id)
        self._recent.pop(replica_id, None)
        self._pending.pop(replica_id, None)
        self._churn.pop(replica_id, None)


def _waiting(replica: ReplicaView) -> int | None:
    """The requests its engine reports waiting (corrected for what was sent since); None
    without a scrape, when nothing is known of its slots and the prefill bookkeeping alone
    decides."""
    counts = running_and_waiting(replica)
    return None if counts is None else counts[1]
