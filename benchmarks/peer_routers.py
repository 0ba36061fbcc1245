"""Do real routers drive `gpufleet replica` as they drive vLLM?

sglang-router and vllm-router (each from PyPI, in its own venv outside the project via
benchmarks/peers.py) are started on 127.0.0.1 in front of two `gpufleet replica` processes;
streamed chat and completion requests go through each router and must complete. The
replicas log every HTTP request, so anything a router asked for that the replica lacks shows
up as a 404/405 and is listed in the results; router warnings are counted too (sglang-router
loads each worker's tokenizer from the model_path of its /get_model_info, which the replica
points at a local directory, so it never asks a model hub).

    .venv/bin/python benchmarks/peer_routers.py [--requests 40]

Results: benchmarks/results/peer_routers.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess
from peers import peer_bin
from record import RAW, write_result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def router_command(name: str, port: int, workers: list[str]) -> list[str]:
    metrics_port = str(free_port())
    if name == "sglang-router":
        exe = peer_bin("sglang-router", "sglang-router")
        return [
            str(exe),
            "launch",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--worker-urls", *workers,
            "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1",
            "--prometheus-port", metrics_port,
            "--log-level", "warn",
        ]  # fmt: skip
    exe = peer_bin("vllm-router", "vllm-router")
    return [
        str(exe),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--worker-urls", *workers,
        "--policy", "round_robin",
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", metrics_port,
        "--log-level", "warning",
    ]  # fmt: skip


async def wait_ready(
    url: str, timeout_s: float, proc: subprocess.Popen[bytes], statuses: Counter[int]
) -> float:
    """Poll the router's /v1/models until 200; `statuses` counts the answers before that
    (a router answers 5xx while it has no ready worker, and may log them as errors)."""
    start = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - start < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"router exited with {proc.returncode}")
            try:
                async with s.get(url + "/v1/models", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    statuses[r.status] += 1
                    if r.status == 200:
                        return time.monotonic() - start
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"router not ready after {timeout_s}s")


async def drive(url: str, n: int) -> dict[str, object]:
    """n streamed requests (alternating chat / completions), 8 at a time."""
    ok = 0
    errors: Counter[str] = Counter()
    sem = asyncio.Semaphore(8)

    async def one(i: int, s: aiohttp.ClientSession) -> None:
        nonlocal ok
        chat = i % 2 == 0
        body: dict[str, object] = {
            "model": MODEL,
            "max_tokens": 16,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if chat:
            body["messages"] = [{"role": "user", "content": f"question {i} about routers"}]
        else:
            body["prompt"] = f"prompt {i} about routers"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        async with sem:
            try:
                async with s.post(url + path, json=body) as r:
                    if r.status != 200:
                        errors[f"HTTP {r.status}: {(await r.text())[:120]}"] += 1
                        return
                    done = False
                    usage = None
                    async for line in r.content:
                        if line.startswith(b"data: [DONE]"):
                            done = True
                        elif line.startswith(b"data: {"):
                            chunk = json.loads(line[6:])
                            usage = chunk.get("usage") or usage
                    if done and usage and usage["completion_tokens"] == 16:
                        ok += 1
                    else:
                        errors["stream ended without [DONE] or usage"] += 1
            except (aiohttp.ClientError, TimeoutError) as e:
                errors[type(e).__name__] += 1

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        await asyncio.gather(*(one(i, s) for i in range(n)))
    return {"completed": ok, "errors": dict(errors)}


def replica_requests(stderr_text: str) -> tuple[Counter[str], Counter[str]]:
    """(path -> count of answered requests, 'METHOD path status' -> count of 4xx answers)."""
    seen: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    for m in re.finditer(r'"(GET|POST|PUT|DELETE|HEAD) (\S+) HTTP/[\d.]+" (\d{3})', stderr_text):
        method, path, status = m.group(1), m.group(2).split("?")[0], int(m.group(3))
        seen[f"{method} {path}"] += 1
        if status in (404, 405):
            missing[f"{method} {path} {status}"] += 1
    return seen, missing


def run_router(name: str, n: int) -> dict[str, object]:
    flags = ["--step-time", "base_s=0.005,per_token_s=1e-6", "--access-log"]
    replicas = [ReplicaProcess(*flags), ReplicaProcess(*flags)]
    port = free_port()
    result: dict[str, object] = {"router": name}
    proc: subprocess.Popen[bytes] | None = None
    log = RAW / f"peer_routers_{name}.log"
    try:
        cmd = router_command(name, port, [r.url for r in replicas])
        with log.open("wb") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            statuses: Counter[int] = Counter()
            result["ready_s"] = round(asyncio.run(wait_ready(url, 90, proc, statuses)), 2)
            result["ready_poll_statuses"] = dict(statuses)
            result.update(asyncio.run(drive(url, n)))
    except Exception as e:  # report, and still clean up
        result["failure"] = f"{type(e).__name__}: {e}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        per_replica = []
        all_missing: Counter[str] = Counter()
        for r in replicas:
            r.stop()
            seen, missing = replica_requests(r.stderr_text())
            r.close()
            per_replica.append(dict(seen))
            all_missing.update(missing)
        result["replica_requests"] = per_replica
        result["replica_404s"] = dict(all_missing)
        text = log.read_text(errors="replace") if log.exists() else ""
        result["router_warnings"] = [
            line[-300:] for line in text.splitlines() if "WARN" in line or "ERROR" in line
        ][:10]
        result["router_log_tail"] = text[-1500:]
    result["requests"] = n
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--routers", nargs="*", default=["sglang-router", "vllm-router"])
    args = ap.parse_args()
    RAW.mkdir(parents=True, exist_ok=True)
    rows = [run_router(name, args.requests) for name in args.routers]
    lines = [
        "| router | ready (s) | completed | errors | split over replicas | replica 404/405 "
        "| router warnings |",
        "| --- | ---: | ---: | --- | --- | --- | ---: |",
    ]
    for r in rows:
        split = []
        for seen in r.get("replica_requests", []):  # type: ignore[union-attr]
            gen = sum(v for k, v in seen.items() if "completions" in k)
            split.append(str(gen))
        lines.append(
            f"| {r['router']} | {r.get('ready_s', '-')} | {r.get('completed', 0)}/{r['requests']} "
            f"| {r.get('errors') or r.get('failure') or '-'} | {' / '.join(split)} "
            f"| {r.get('replica_404s') or 'none'} | {len(r.get('router_warnings', []))} |"
        )
    write_result("peer_routers", {"rows": rows}, "\n".join(lines), peers=args.routers)
    print("\n".join(lines))
    for r in rows:
        print(r["router"], "replica requests:", r.get("replica_requests"))


if __name__ == "__main__":
    main()
