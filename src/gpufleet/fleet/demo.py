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
    # The in-flight trend a cold start ahead (the forecast the windows above were set
    # for): the arrival rate, counted over 30 s, lags the demo's 30 s ramp by more than
    # a cold start (wave 18: TTFT p90 up to 2.6 s in the simulator without it).
    "batch_trend": True,
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


# prefix_aware lets a replica take a request while its in-flight count stays within
# max(inflight_factor × the mean, the mean + inflight_slack): 2× and a slack of 8 of a
# 256-sequence batch by default. The slack follows the replicas' batch (`batch_size`, which
# the fleet config passes from --max-num-seqs: 1 of 8 here); the factor 2× lets a replica
# holding a prefix queue a whole 8-sequence batch while others idle (wave 18: TTFT p99 of
# several seconds with 4–6 replicas up). Here: at most one over the mean.
DEMO_ROUTING_OPTIONS: dict[str, float] = {"inflight_factor": 1.0}


def demo_fleet_data(policy: str = "default") -> dict[str, object]:
    return {
        "gateway": {"policy": "prefix_aware", "policy_options": dict(DEMO_ROUTING_OPTIONS)},
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
