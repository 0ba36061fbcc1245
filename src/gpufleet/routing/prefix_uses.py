"""How much traffic each shared prompt prefix carries, and whether it is one-shot.

`PrefixAware` keys a prompt by the last block of its shared prefix (a system prompt, an
agent's tools: `PrefixIndex.shared_depth`) and counts, decayed per routing decision as its
share window is, the prompts under each key and those of them that continue a conversation
(a match past the shared prefix). From the two it tells how much of a replica a prefix's
traffic fills, and whether a new prompt under it is one-shot (nothing continues it) or
starts a conversation whose later turns will follow it.
"""

from __future__ import annotations


class PrefixUses:
    """Decayed counts per shared-prefix key; memory bounded by `max_keys`."""

    def __init__(self, decay: float, max_keys: int = 32_768) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError("decay must be in (0, 1)")
        self.decay = decay
        self.max_keys = max_keys
        self._decisions = 0
        self._counts: dict[int, tuple[float, float, int]] = {}  # key -> (uses, continued, at)

    def tick(self) -> None:
        """One routing decision went by (every count decays once)."""
        self._decisions += 1

    def get(self, key: int) -> tuple[float, float]:
        """(prompts, of them continuing a conversation) under `key`, decayed."""
        entry = self._counts.get(key)
        if entry is None:
            return 0.0, 0.0
        uses, continued, at = entry
        f = self.decay ** (self._decisions - at)
        return uses * f, continued * f

    def add(self, key: int, continues: bool) -> None:
        """One more prompt under `key` (`continues`: it continues a conversation)."""
        uses, continued = self.get(key)
        self._counts[key] = (uses + 1.0, continued + float(continues), self._decisions)
        if len(self._counts) > self.max_keys:  # forget the faded ones
            now, decay = self._decisions, self.decay
            kept = {k: v for k, v in self._counts.items() if v[0] * decay ** (now - v[2]) > 0.1}
            if len(kept) > self.max_keys // 2:  # (a long window: the least recent half goes)
                recent = sorted(kept.items(), key=lambda kv: kv[1][2])[-(self.max_keys // 2) :]
                kept = dict(recent)
            self._counts = kept

    def one_shot_fill(self, key: int, replicas: int, decisions: float) -> float:
        """How little a prompt under `key` has to move for: 1 - its prefix's share of one
        replica's traffic (its prompts over `decisions` recent ones, x `replicas`) when
        its prompts are one-shot, fading to 0 as they start conversations (continuations
        per prompt that starts one). 0 for an unknown key."""
        uses, continued = self.get(key)
        if uses <= 0.0:
            return 0.0
        fill = min(1.0, uses * replicas / max(1.0, decisions))
        one_shot = max(0.0, 1.0 - continued / max(1.0, uses - continued))
        return (1.0 - fill) * one_shot
