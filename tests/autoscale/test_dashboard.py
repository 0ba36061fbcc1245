"""The gpufleet Grafana dashboard reads only metrics the code really exports: every query's
metric names (parsed from its PromQL) are found in a live /metrics of the gateway (with the
autoscaler) and of a replica, under `gpufleet up`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.dashboards import DASHBOARD_PATH, build_dashboard, metric_names
from gpufleet.dashboards.build import render

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
MODEL = "meta-llama/Llama-3.1-8B"


pytestmark = pytest.mark.process  # starts processes and servers on loopback


def _get(url: str, headers: dict[str, str] | None = None) -> bytes:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        data: bytes = resp.read()
        return data


def _post(url: str, body: dict[str, object]) -> bytes:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        data: bytes = resp.read()
        return data


def _exported(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_committed_dashboard_is_the_built_one() -> None:
    assert DASHBOARD_PATH.read_text() == render()


def test_promql_names() -> None:
    expr = 'sum by (le) (rate(a_bucket{code!~"2.."}[5m])) / on(x) b offset 5m > bool 1e3'
    assert metric_names(expr) == {"a_bucket", "b"}
    assert metric_names("histogram_quantile(0.9, sum(rate(vllm:x_bucket[$__rate_interval])))") == {
        "vllm:x_bucket"
    }


def test_every_query_reads_exported_metrics(tmp_path: Path) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(
        "replicas:\n  startup_s: 0.2\nautoscale:\n  min_replicas: 1\n  max_replicas: 2\n"
        "gateway:\n  admin_key: k\n"
    )
    proc = subprocess.Popen(
        [GPUFLEET, "up", str(cfg), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        m = re.search(r"gateway on (http://127\.0\.0\.1:\d+)", proc.stdout.readline())
        assert m
        url = m.group(1)
        admin = {"Authorization": "Bearer k"}
        deadline = time.monotonic() + 60
        while True:
            state = json.loads(_get(url + "/admin/autoscale", admin))
            ready = [r for r in state["replicas"] if r["state"] == "ready"]
            if ready and json.loads(_get(url + "/v1/models"))["data"]:
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
        for i in range(4):
            body = {"model": MODEL, "prompt": f"w{i} " * 40, "max_tokens": 3, "stream": i % 2 == 0}
            _post(url + "/v1/completions", body)
        time.sleep(1.5)  # one autoscaler tick and one scrape
        exported = _exported(_get(url + "/metrics").decode())
        exported |= _exported(_get(ready[0]["url"] + "/metrics").decode())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    missing = {}
    for panel in build_dashboard()["panels"]:
        for target in panel["targets"]:
            absent = metric_names(target["expr"]) - exported
            if absent:
                missing[f"{panel['title']} / {target['legendFormat']}"] = sorted(absent)
    assert not missing, missing
