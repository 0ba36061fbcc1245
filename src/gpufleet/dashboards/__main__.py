"""Install the gpufleet Grafana dashboard without docker compose.

    python -m gpufleet.dashboards --grafana http://127.0.0.1:3000 --token $GRAFANA_TOKEN
        POSTs it through Grafana's HTTP API (/api/dashboards/db), replacing an older copy.
    python -m gpufleet.dashboards --provision-dir /etc/grafana/provisioning \
        --prometheus http://127.0.0.1:9090
        writes a file provider, the dashboard and a Prometheus data source, for Grafana's
        file provisioning (restart Grafana to load them).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from gpufleet.dashboards.build import DASHBOARD_PATH


def post_dashboard(grafana_url: str, token: str | None, basic: str | None) -> dict[str, object]:
    dashboard = json.loads(DASHBOARD_PATH.read_text())
    body = json.dumps({"dashboard": dashboard, "overwrite": True, "folderId": 0}).encode()
    req = urllib.request.Request(
        grafana_url.rstrip("/") + "/api/dashboards/db",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    elif basic:
        req.add_header("Authorization", "Basic " + base64.b64encode(basic.encode()).decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        result: dict[str, object] = json.loads(resp.read())
    return result


def write_provisioning(directory: Path, prometheus_url: str) -> list[Path]:
    dashboards = directory / "dashboards"
    json_dir = dashboards / "gpufleet"
    json_dir.mkdir(parents=True, exist_ok=True)
    (json_dir / "gpufleet.json").write_text(
        DASHBOARD_PATH.read_text().replace("${DS_PROMETHEUS}", "gpufleet-prometheus")
    )
    provider = dashboards / "gpufleet.yaml"
    provider.write_text(
        "apiVersion: 1\nproviders:\n  - name: gpufleet\n    type: file\n"
        f"    options:\n      path: {json_dir.resolve()}\n"
    )
    sources = directory / "datasources"
    sources.mkdir(parents=True, exist_ok=True)
    source = sources / "gpufleet-prometheus.yaml"
    source.write_text(
        "apiVersion: 1\ndatasources:\n  - name: Prometheus (gpufleet)\n    type: prometheus\n"
        f"    uid: gpufleet-prometheus\n    access: proxy\n    url: {prometheus_url}\n"
    )
    return [provider, json_dir / "gpufleet.json", source]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpufleet.dashboards", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--grafana", help="Grafana URL, e.g. http://127.0.0.1:3000")
    ap.add_argument("--token", help="a Grafana service-account token")
    ap.add_argument("--basic-auth", help="USER:PASSWORD instead of a token")
    ap.add_argument("--provision-dir", type=Path, help="Grafana's provisioning directory")
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090", help="for --provision-dir")
    args = ap.parse_args(argv)
    if not args.grafana and not args.provision_dir:
        ap.error("give --grafana URL or --provision-dir DIR")
    if args.provision_dir:
        for path in write_provisioning(args.provision_dir, args.prometheus):
            print(f"wrote {path}")
    if args.grafana:
        try:
            result = post_dashboard(args.grafana, args.token, args.basic_auth)
        except (urllib.error.URLError, OSError) as e:
            print(f"error: --grafana: cannot post the dashboard: {e}", file=sys.stderr)
            return 1
        print(f"dashboard at {args.grafana.rstrip('/')}{result.get('url', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
