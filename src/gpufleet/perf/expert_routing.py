"""How many distinct routed experts a batch reads: what a decode step's MoE time grows with.

Under uniform routing, G tokens that each pick k of E experts touch E(1 - (1 - k/E)^G)
distinct experts. Real routers are not uniform: some experts are picked far more often
than others (per-expert load counts in serving show a long tail; DeepSeek's EPLB exists to
spread the hot ones), so a batch's tokens pile onto the popular experts and touch fewer
distinct ones than uniform routing says — fewer expert weights read per step — until the
batch is large enough to reach the rare ones too. Popularity is modelled as Zipf: the
i-th most popular expert is picked with probability proportional to i^-skew (skew 0:
uniform), scaled so each token picks k experts, none more often than every token.
"""

from __future__ import annotations

import functools
import math
import random


def expert_pick_probabilities(num_experts: int, top_k: int, skew: float) -> tuple[float, ...]:
    """Per-token probability that each expert is among a token's top_k (sums to top_k).

    Zipf weights i^-skew scaled to sum to top_k; an expert whose share would exceed 1 is
    picked by every token and its excess spread over the rest in proportion."""
    if num_experts < 1 or not 0 < top_k <= num_experts:
        raise ValueError("need 0 < top_k <= num_experts")
    if skew < 0:
        raise ValueError("skew must be >= 0")
    weights = [(i + 1) ** -skew for i in range(num_experts)]
    probs = [0.0] * num_experts
    free = list(range(num_experts))
    left = float(top_k)
    while free:
        total = sum(weights[i] for i in free)
        capped = {i for i in free if left * weights[i] / total >= 1.0}
        if not capped:
            for i in free:
                probs[i] = left * weights[i] / total
            break
        for i in capped:
            probs[i] = 1.0
        left -= len(capped)
        free = [i for i in free if i not in capped]
    return tuple(probs)


# Placements averaged over when experts sit on EP ranks without regard to popularity.
_PLACEMENTS = 8


@functools.cache
def _rank_groups(num_experts: int, ep: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Expert ids of each EP rank in a few placements that ignore popularity.

    The engines place experts by id (rank r holds a contiguous block; no EPLB by
    default) and which experts are popular has nothing to do with their ids, so a rank's
    experts are a random draw of popularity ranks: seeded, so the model is deterministic."""
    rng = random.Random(0)
    out = []
    per = math.ceil(num_experts / ep)
    for _ in range(_PLACEMENTS):
        ids = list(range(num_experts))
        rng.shuffle(ids)
        out.append(tuple(tuple(ids[r * per : (r + 1) * per]) for r in range(ep)))
    return tuple(out)


class ExpertRouting:
    """What one EP rank's routed experts see from a batch: the distinct experts it reads
    and the token assignments it computes, for the busiest rank (the others wait for it
    at the combine), averaged over placements. Cached per token count."""

    def __init__(self, num_experts: int, top_k: int, skew: float, ep: int = 1) -> None:
        self.num_experts = num_experts
        self.top_k = top_k
        self.skew = skew
        self.ep = max(1, min(ep, num_experts))
        self._uniform = skew == 0.0
        probs = expert_pick_probabilities(num_experts, top_k, skew)
        self._log_miss = tuple(math.log1p(-p) if p < 1.0 else -math.inf for p in probs)
        if self._uniform or self.ep == 1:
            self._groups: tuple[tuple[tuple[int, ...], ...], ...] = ((tuple(range(num_experts)),),)
        else:
            self._groups = _rank_groups(num_experts, self.ep)
        # Share of all token-expert assignments the busiest rank receives (1/ep if even).
        if self._uniform:
            self.busiest_assignment_share = 1.0 / self.ep
        else:
            shares = [max(sum(probs[i] for i in g) for g in pl) / top_k for pl in self._groups]
            self.busiest_assignment_share = sum(shares) / len(shares)
        self._touched: dict[int, float] = {}

    def rank_distinct_experts(self, tokens: int) -> float:
        """Expected distinct experts the busiest rank reads for `tokens` tokens."""
        if tokens <= 0:
            return 0.0
        got = self._touched.get(tokens)
        if got is None:
            if self._uniform:
                e, k = self.num_experts, self.top_k
                got = math.ceil(e / self.ep) * (1.0 - (1.0 - k / e) ** tokens)
            else:
                hit = [1.0 - math.exp(tokens * lm) for lm in self._log_miss]
                per = [max(sum(hit[i] for i in g) for g in pl) for pl in self._groups]
                got = sum(per) / len(per)
            if len(self._touched) > 8192:
                self._touched.clear()
            self._touched[tokens] = got
        return got


@functools.lru_cache(maxsize=256)
def expert_routing(num_experts: int, top_k: int, skew: float, ep: int = 1) -> ExpertRouting:
    """One shared ExpertRouting per (experts, top_k, skew, EP ranks): every step-time
    model of the same MoE layout reuses its cached counts."""
    return ExpertRouting(num_experts, top_k, skew, ep)
