"""Grafana dashboards for gpufleet (JSON files shipped with the package).

    python -m gpufleet.dashboards --grafana http://127.0.0.1:3000 --token $GRAFANA_TOKEN
    python -m gpufleet.dashboards --provision-dir /etc/grafana/provisioning

See docs/observability.md.
"""

from gpufleet.dashboards.build import DASHBOARD_PATH, build_dashboard
from gpufleet.dashboards.promql import metric_names

__all__ = ["DASHBOARD_PATH", "build_dashboard", "metric_names"]
