"""Slow start: a replica that just became ready takes a ramped share of new requests.

Least-outstanding routing sends a just-ready replica every arrival until it holds as many
requests as the others, and it prefills them all at once (docs/up.md, Wave 16). Envoy's
`slow_start_config` ramps a new endpoint's weight over `slow_start_window`:
weight = max(min_weight_percent, time_factor ** (1 / aggression)), time_factor =
max(age, 1 s) / window. Policies that compare loads divide a replica's in-flight count by its
`ReplicaView.slow_start_weight` (as Envoy's least-request divides by weight). Pure.
"""

from __future__ import annotations

import math

MIN_WEIGHT = 0.1  # Envoy's min_weight_percent default (10 %)
AGGRESSION = 1.0  # Envoy's aggression default: a linear ramp


def slow_start_weight(
    age_s: float, window_s: float, aggression: float = AGGRESSION, min_weight: float = MIN_WEIGHT
) -> float:
    """The weight (min_weight..1) of a replica ready for `age_s` of a `window_s` ramp."""
    if window_s <= 0 or age_s >= window_s:
        return 1.0
    time_factor = max(1.0, age_s) / window_s  # (Envoy counts at least a second)
    return max(min_weight, math.pow(time_factor, 1.0 / aggression))
