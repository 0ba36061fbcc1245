"""No request lost: closed-loop clients through each proxy while replicas die or stall.

    python benchmarks/failover.py [--duration-s 60] [--every-s 10] [--clients 64]
        [--faults kill,stall] [--peers gpufleet,sglang-router,vllm-router]

Three `gpufleet replica` processes (deterministic answers per seed: every answer is checked
against the uninterrupted one) serve behind each proxy in turn, with the proxy's default
health checking. `--clients` closed-loop clients (half streaming, chat and completions)
run for `--duration-s` while, every `--every-s` seconds,
- kill: one replica is SIGKILLed and started again on the same port (replaced);
- stall: one replica runs 300x slower (2 s a token) until the next one takes its turn.
Each answer is classed by `gpufleet.bench.chaos` (ok, error, truncated, error_event,
wrong_text, malformed). The gateway resumes broken streams on another replica (its
inter-token timeout is set to 2 s for the stall run); the routers retry before the
first byte only, so what they relay after it is what the client gets.
Results: benchmarks/results/failover.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gateway_overhead import free_port, start, stop  # noqa: E402
from gpufleet.bench.chaos import KINDS, mixed_requests, run_chaos  # noqa: E402
from gpufleet.replica.generation import expected_answer  # noqa: E402
from peers import PEER_VERSIONS, rust_router_argv  # noqa: E402
from record import write_result  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B"
_CLI = "import sys; from gpufleet.cli import main; sys.argv[0] = 'gpufleet'; main()"


class Replica:
    """A `gpufleet replica` on a fixed port, so that a restarted one is the same URL."""

    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-c", _CLI, "replica", "--model", MODEL, "--port",
                str(self.port), "--step-time", "base_s=0.01"]  # fmt: skip
        self.proc = start(argv, None, self.log)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    async def wait_healthy(self, timeout_s: float = 60.0) -> None:
        await wait_ok("GET", self.url + "/health", None, timeout_s, 0.2)

    async def slow(self, factor: float) -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(self.url + "/admin/faults", json={"slow_factor": factor}) as r,
        ):
            r.raise_for_status()


def proxy_argv(peer: str, port: int, upstreams: list[str], tmp: Path, fault: str) -> list[str]:
    if peer == "gpufleet":
        config = {"port": port, "policy": "round_robin",
                  "replicas": [{"url": u} for u in upstreams],
                  "failover": {"inter_token_timeout_s": 2.0 if fault == "stall" else 30.0}}  # fmt: skip
        path = tmp / "gateway.json"  # JSON is YAML
        path.write_text(json.dumps(config))
        return [sys.executable, "-c", _CLI, "gateway", "--config", str(path),
                "--log-level", "WARNING"]  # fmt: skip
    if peer in ("sglang-router", "vllm-router"):
        return rust_router_argv(peer, port, upstreams)
    raise ValueError(peer)


async def wait_ok(
    method: str, url: str, body: dict[str, Any] | None, timeout_s: float, every_s: float
) -> None:
    """Until `url` answers 200 (a replica's /health, or a proxy serving a completion)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    async with aiohttp.ClientSession() as s:
        while loop.time() < end:
            try:
                async with s.request(method, url, json=body) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(every_s)
    raise RuntimeError(f"{method} {url} did not answer 200 within {timeout_s:g} s")


async def wait_serving(url: str, timeout_s: float = 60.0) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    await wait_ok("POST", url + "/v1/completions", body, timeout_s, 0.3)


async def run_one(args: argparse.Namespace, peer: str, fault: str, tmp: Path) -> dict[str, Any]:
    replicas = [Replica(free_port(), tmp / f"replica{i}.log") for i in range(3)]
    for r in replicas:
        r.start()
    port = free_port()
    proc = None
    row: dict[str, Any] = {"peer": peer, "fault": fault}
    try:
        await asyncio.gather(*(r.wait_healthy() for r in replicas))
        argv = proxy_argv(peer, port, [r.url for r in replicas], tmp, fault)
        proc = start(argv, None, tmp / f"{peer}.log")
        url = f"http://127.0.0.1:{port}"
        await wait_serving(url)

        async def kill(n: int) -> None:
            victim = replicas[n % 3]
            victim.kill()
            victim.start()  # replaced: back on the same port a second or two later

        async def stall(n: int) -> None:
            await replicas[(n - 1) % 3].slow(1.0)
            await replicas[n % 3].slow(300.0)

        async def settle() -> None:
            if fault == "stall":
                for r in replicas:
                    await r.slow(1.0)

        report = await run_chaos(url, mixed_requests(MODEL, expected_answer), clients=args.clients,
                                 duration_s=args.duration_s, every_s=args.every_s,
                                 disrupt=kill if fault == "kill" else stall, settle=settle)  # fmt: skip
        row.update(report.to_json())
    except Exception as exc:  # one peer failing must not lose the others
        row["failure"] = repr(exc)
    finally:
        if proc is not None:
            stop(proc)
        for r in replicas:
            r.kill()
    print(json.dumps(row), flush=True)
    return row


def write(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    lines = ["| proxy | fault | requests | " + " | ".join(KINDS) + " | disruptions |",
             "|---|---|---|" + "---|" * len(KINDS) + "---|"]  # fmt: skip
    for r in rows:
        if "failure" in r:
            lines.append(f"| {r['peer']} | {r['fault']} | failure: {r['failure'][:80]} |")
            continue
        lines.append(f"| {r['peer']} | {r['fault']} | {r['total']} | "
                     + " | ".join(str(r.get(k, 0)) for k in KINDS)
                     + f" | {r['disruptions']} |")  # fmt: skip
    setup = {"duration_s": args.duration_s, "every_s": args.every_s, "clients": args.clients}
    peers = [p for p in args.peers.split(",") if p in PEER_VERSIONS]
    write_result(args.out, {"setup": setup, "rows": rows}, "\n".join(lines), peers=peers)
    print("\n".join(lines))


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="failover-") as tmp_name:
        for fault in args.faults.split(","):
            for peer in args.peers.split(","):
                rows.append(await run_one(args, peer, fault, Path(tmp_name)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--every-s", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--faults", default="kill,stall")
    ap.add_argument("--peers", default="gpufleet,sglang-router,vllm-router")
    ap.add_argument("--out", default="failover")
    args = ap.parse_args()
    write(asyncio.run(main_async(args)), args)


if __name__ == "__main__":
    main()
