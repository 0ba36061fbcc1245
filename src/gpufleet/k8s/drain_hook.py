"""The replica pods' preStop hook: drain this pod at every gateway, then wait for its requests.

Kubernetes runs it before it sends SIGTERM to the engine, whoever removes the pod: the
gpufleet controller scaling in, KEDA or an HPA scaling in, a rollout, a node drain. It
runs inside the engine's own image (vLLM or SGLang) as `python3 -c <this file>`, so it uses
the standard library only. Settings come from the environment the manifests set:

- POD_NAME: this pod's name, which is its replica id at the gateways
- GPUFLEET_GATEWAY_PEERS: host:port of the headless gateway Service (an A record per pod)
- GPUFLEET_ADMIN_KEY: the gateways' admin key
- GPUFLEET_DRAIN_DEADLINE_S: how long requests in flight may take to finish
- GPUFLEET_ENGINE_URL: this pod's engine (default http://127.0.0.1:8000)

Steps: POST /admin/replicas/POD_NAME/drain on every gateway (no new requests; 404 means
that gateway never knew the pod), then poll until no gateway has a request in flight to
it and the engine's own /metrics shows nothing running or waiting, or the deadline
passes. It always exits 0: the kubelet goes on to SIGTERM either way.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

# Requests running + waiting inside the engine, by engine (vLLM V0/V1 and SGLang names).
ENGINE_LOAD_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
)
POLL_S = 1.0


def log(message: str) -> None:
    print(f"gpufleet preStop: {message}", file=sys.stderr, flush=True)


def gateway_urls(peers: str) -> list[str]:
    """One base URL per address the headless Service name resolves to."""
    host, _, port = peers.rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError) as e:
        log(f"cannot resolve {peers}: {e}")
        return []
    addresses = sorted({str(info[4][0]) for info in infos})
    return [f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in addresses]


def call(method: str, url: str, key: str, timeout_s: float = 3.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return int(e.code), b""
    except (OSError, ValueError):
        return 0, b""


def gateway_in_flight(url: str, key: str, pod: str) -> int:
    status, body = call("GET", f"{url}/admin/replicas", key)
    if status != 200:
        return 0  # unreachable or gone: it sends this pod nothing more
    for replica in json.loads(body).get("replicas", []):
        if replica.get("id") == pod:
            return int(replica.get("in_flight") or 0)
    return 0


def engine_load(metrics_text: str) -> int:
    total = 0.0
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ENGINE_LOAD_METRICS:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return int(total)


def engine_in_flight(engine_url: str) -> int:
    try:
        with urllib.request.urlopen(f"{engine_url}/metrics", timeout=3.0) as resp:
            return engine_load(resp.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return 0  # the engine is not answering: nothing to wait for


def drain(
    env: dict[str, str],
    now: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> int:
    """Returns the requests still in flight when it stopped waiting (0 = a clean drain)."""
    pod = env.get("POD_NAME", socket.gethostname())
    key = env.get("GPUFLEET_ADMIN_KEY", "")
    deadline_s = float(env.get("GPUFLEET_DRAIN_DEADLINE_S", "60"))
    engine_url = env.get("GPUFLEET_ENGINE_URL", "http://127.0.0.1:8000").rstrip("/")
    peers = env.get("GPUFLEET_GATEWAY_PEERS", "")
    gateways = gateway_urls(peers) if peers else []
    for url in gateways:
        status, _ = call("POST", f"{url}/admin/replicas/{pod}/drain", key)
        log(f"drain {pod} at {url}: HTTP {status}")
    end = now() + deadline_s
    left = 0
    while True:
        left = sum(gateway_in_flight(u, key, pod) for u in gateways) + engine_in_flight(engine_url)
        if left == 0 or now() >= end:
            break
        pause(POLL_S)
    if left:
        log(f"deadline {deadline_s:g} s passed with {left} requests in flight")
    else:
        log("drained")
    return left


if __name__ == "__main__":
    drain(dict(os.environ))
    sys.exit(0)
