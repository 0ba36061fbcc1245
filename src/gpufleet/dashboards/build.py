"""The Grafana dashboard for a gpufleet fleet (gateway, autoscaler, replicas), built in code.

`gpufleet.json` next to this file is its output (a test keeps them equal); regenerate with
`python -m gpufleet.dashboards.build`. Every query reads metrics the code exports: the
gateway's `gpufleet_gateway_*`, the autoscaler's `gpufleet_autoscale_*` (both on the
gateway's /metrics) and the replicas' vLLM `vllm:*` (each replica's /metrics).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DASHBOARD_PATH = Path(__file__).with_name("gpufleet.json")
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
RATE = "[$__rate_interval]"


def _quantiles(metric: str) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{RATE})))",
            f"p{round(q * 100)}",
        )
        for q in (0.5, 0.9, 0.99)
    ]


# (title, unit, description, [(PromQL, legend)])
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("Requests per replica", "reqps", "Attempts the gateway sent to each replica.",
     [(f"sum by (replica) (rate(gpufleet_gateway_replica_requests_total{RATE}))", "{{replica}}")]),
    ("Errors per replica and answered errors", "reqps",
     "Failed attempts per replica, and the error codes clients got.",
     [(f"sum by (replica) (rate(gpufleet_gateway_replica_errors_total{RATE}))", "{{replica}} failed"),
      (f"sum by (replica) (rate(gpufleet_gateway_replica_retries_total{RATE}))", "{{replica}} retried"),
      (f'sum by (code) (rate(gpufleet_gateway_requests_total{{code!~"2.."}}{RATE}))', "HTTP {{code}}")]),
    ("TTFT (gateway)", "s", "Time to first token as clients see it.",
     _quantiles("gpufleet_gateway_time_to_first_token_seconds")),
    ("TPOT (gateway)", "s", "Time per output token of streamed requests.",
     _quantiles("gpufleet_gateway_time_per_output_token_seconds")),
    ("E2E latency (gateway)", "s", "End-to-end request latency.",
     _quantiles("gpufleet_gateway_e2e_request_latency_seconds")),
    ("Queue depth", "short",
     "Requests waiting at the gateway for a ready replica, and in the replicas' own queues.",
     [("gpufleet_gateway_queue_depth", "gateway queue"),
      ("sum(vllm:num_requests_waiting)", "waiting in replicas"),
      ("sum(vllm:num_requests_running)", "running in replicas")]),
    ("In flight per replica", "short", "Requests the gateway has sent and not seen finish.",
     [("sum by (replica) (gpufleet_gateway_replica_in_flight)", "{{replica}}")]),
    ("KV cache usage", "percentunit", "Each replica's KV-cache usage (1 = full).",
     [("max by (instance) (vllm:kv_cache_usage_perc)", "{{instance}}")]),
    ("Prefix cache hit rate", "percentunit", "Prompt tokens served from the prefix cache.",
     [(f"sum(rate(vllm:prefix_cache_hits_total{RATE})) / sum(rate(vllm:prefix_cache_queries_total{RATE}))",
       "fleet"),
      (f"sum by (instance) (rate(vllm:prefix_cache_hits_total{RATE})) / "
       f"sum by (instance) (rate(vllm:prefix_cache_queries_total{RATE}))", "{{instance}}")]),
    ("Replicas", "short", "Replicas by state (autoscaler) and what the policy wants.",
     [("sum by (state) (gpufleet_autoscale_replicas)", "{{state}}"),
      ("sum(gpufleet_autoscale_desired_replicas)", "desired"),
      ("sum by (state) (gpufleet_gateway_replica_state)", "gateway: {{state}}")]),
    ("Scaling decisions", "short", "Scale-outs and scale-ins per interval.",
     [(f'sum by (direction) (increase(gpufleet_autoscale_decisions_total{{direction!="hold"}}{RATE}))',
       "scale {{direction}}")]),
    ("Replica TTFT (vLLM)", "s", "Time to first token inside the replicas.",
     _quantiles("vllm:time_to_first_token_seconds")),
]  # fmt: skip


def build_dashboard() -> dict[str, Any]:
    panels = []
    for i, (title, unit, description, queries) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "description": description,
                "datasource": DS,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {
                        "datasource": DS,
                        "expr": expr,
                        "legendFormat": legend,
                        "refId": chr(ord("A") + j),
                    }
                    for j, (expr, legend) in enumerate(queries)
                ],
            }
        )
    return {
        "title": "gpufleet — gateway, autoscaler, replicas",
        "uid": "gpufleet-fleet",
        "description": "One fleet: traffic and errors per replica, latency percentiles, queues, "
        "KV usage, prefix-cache hits, replicas and scaling decisions over time.",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-15m", "to": "now"},
        "refresh": "5s",
        "tags": ["gpufleet", "vllm", "llm-inference"],
        "templating": {
            "list": [
                {
                    "name": "DS_PROMETHEUS",
                    "label": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "hide": 0,
                }
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build_dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    DASHBOARD_PATH.write_text(render())
    print(f"wrote {DASHBOARD_PATH}")
