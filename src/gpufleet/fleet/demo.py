"""The fleet `gpufleet up --demo` runs: small enough for a laptop, busy enough to scale.

Simulated Llama-3.1-8B replicas on h100-sxm with an 8-sequence batch and time slowed 3×,
so that a few requests per second saturate a replica and the whole show (quiet, ramp,
burst, quiet) fits in about two minutes on two CPU cores. Cold starts take 8 s.
"""

from __future__ import annotations

from gpufleet.fleet.config import FleetConfig, validate_fleet

DEMO_BATCH = 8
# capacity_per_replica is left to the fleet, which derives it from the plan:
# min(--max-num-seqs 8, KV tokens / 1280) = 8 (fleet/config.py, plan/capacity.py).
DEMO_POLICY_PARAMS: dict[str, float] = {
    "cold_start_s": 10.0,
    "headroom_fraction": 0.2,
    "trend_window_s": 15.0,
    "peak_window_s": 20.0,
    "scale_in_stabilization_s": 8.0,
    "scale_in_cooldown_s": 6.0,
}


# The baselines' targets set alike for a fair comparison on the demo fleet: 70 % of the
# batch per replica (KPA applies its own default 70 % utilization to its target).
_TARGET = 0.7 * DEMO_BATCH
DEMO_PARAMS_BY_POLICY: dict[str, dict[str, float]] = {
    "default": DEMO_POLICY_PARAMS,
    "queue_depth": {},
    "hpa": {"target_per_replica": _TARGET},
    "kpa": {"target_per_replica": float(DEMO_BATCH)},
    "ray_serve": {"target_ongoing_requests": _TARGET},
}


def demo_fleet_data(policy: str = "default") -> dict[str, object]:
    return {
        "replicas": {
            "args": f"--max-num-seqs {DEMO_BATCH}",
            "startup_s": 8.0,
            "time_scale": 3.0,
            "drain_deadline_s": 60.0,
        },
        "autoscale": {
            "policy": policy,
            "min_replicas": 1,
            "max_replicas": 6,
            "interval_s": 1.0,
            "params": dict(DEMO_PARAMS_BY_POLICY.get(policy, {})),
        },
    }


def demo_fleet(policy: str = "default") -> FleetConfig:
    return validate_fleet(demo_fleet_data(policy), source="demo fleet")
