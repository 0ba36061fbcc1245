#!/usr/bin/env python3
"""Routing quality: replay workloads through each router onto the same live replicas.

    .venv/bin/python benchmarks/routing_quality.py [SOURCE ...] [--requests 600]
        [--speedup 8] [--repeat 3] [--policy 'prefix_aware:{"option": 1}']
        [--gateway-args '--workers 2']

SOURCE is a trace (Mooncake JSONL with hash_ids, Azure CSV) or synthetic:NAME (one of
system_prompts, multi_turn, tool_agent, mixed: `gpufleet.workload.prefix_sharing`);
default: the shared Mooncake conversation slice. For every gpufleet policy (and beside
sglang-router and vllm-router in cache_aware mode, installed into venvs outside the repo
by benchmarks/peers.py) it starts 4 fresh `gpufleet replica` processes with prefix caching
(fresh, so every router starts from cold caches), the router in front of them, and replays
the workload open-loop at `--speedup` x its pace with streaming chat requests. Mooncake
prompts are built so that equal hash_ids give equal 512-token blocks. Per source and
router it reports:

- mean and p99 TTFT measured by the client (first streamed token),
- prefix-cache hit rate from the replicas' own /metrics (vllm:prefix_cache_hits /
  vllm:prefix_cache_queries, summed over replicas),
- max/mean load: requests served per replica (vllm:request_success) and prefill work
  (prompt tokens not served from cache) per replica; preemptions,
- the hit rate one LRU prefix cache holding all four replicas' blocks would reach on the
  same prompts (computed offline with the engine's block size), and the ratio to it.

`--repeat N` runs every router N times (in turns, so machine noise spreads evenly) and
reports the mean and the range. `--gateway-args` passes extra flags to every
`gpufleet gateway` (e.g. more workers). Writes benchmarks/results/routing_quality.json and
.md (one table per source; committed, like every result). The replicas and routers all run on
this machine's CPUs: on a small machine the absolute TTFTs include CPU contention, so
compare routers within one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpufleet.stats import percentile  # noqa: E402
from record import RESULTS, write_result  # noqa: E402
from routing_workloads import TraceRequest, load_requests, source_label  # noqa: E402

PEERS = {"sglang-router": "sglang-router", "vllm-router": "vllm-router"}  # name: program


def default_trace() -> str:
    """$GPUFLEET_SHARED/traces/mooncake_conversation.jsonl (or ../shared beside a checkout)."""
    from gpufleet.shared_data import shared_file

    return str(shared_file("traces", "mooncake_conversation.jsonl"))


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def spawn(name: str, argv: Sequence[str], logdir: Path) -> Proc:
    log = logdir / f"{name}.log"
    with log.open("wb") as f:
        popen = subprocess.Popen(
            list(argv), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Proc(name, popen, log)


def gpufleet_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", "from gpufleet.cli import main; main()", *args]


async def wait_ready(url: str, proc: Proc, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.25)
    raise RuntimeError(f"{proc.name} not ready at {url} after {timeout_s}s:\n{proc.tail()}")


@contextlib.contextmanager
def cleanup(procs: list[Proc]) -> Iterator[list[Proc]]:
    try:
        yield procs
    finally:
        for p in reversed(procs):
            p.stop()


# ---------------------------------------------------------------- workload


def ideal_hit_rate(requests: Sequence[TraceRequest], block_size: int, blocks: int) -> float:
    """Hit rate of one LRU prefix cache of `blocks` engine blocks over the prompts as the
    replica tokenizes them (chat template), in arrival order."""
    from gpufleet.routing.replay import ReplayRequest, pooled_cache_hit_rate
    from routing_workloads import hash_requests

    hashed = hash_requests(requests, block_size)
    prompts = [
        ReplayRequest(h.arrival_s, (), cache_hashes=h.engine_hashes, prompt_tokens=h.prompt_tokens)
        for h in hashed
    ]
    return pooled_cache_hit_rate(prompts, blocks, block_size)


# ---------------------------------------------------------------- client


@dataclass
class Outcome:
    ok: bool
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None


async def one_request(
    http: aiohttp.ClientSession, url: str, model: str, req: TraceRequest, timeout_s: float
) -> Outcome:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": req.text}],
        "max_tokens": req.output_tokens,
        "stream": True,
        "ignore_eos": True,
        "user": req.session,
    }
    start = time.perf_counter()
    ttft: float | None = None
    try:
        async with http.post(
            url + "/v1/chat/completions",
            json=body,
            headers={"X-Session-ID": req.session},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                return Outcome(False, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                if ttft is None:
                    chunk = json.loads(data)
                    if "error" in chunk:
                        return Outcome(False, error=str(chunk["error"])[:200])
                    choices = chunk.get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        ttft = time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError) as e:
        return Outcome(False, error=f"{type(e).__name__}: {e}")
    if ttft is None:
        return Outcome(False, error="no token streamed")
    return Outcome(True, ttft, time.perf_counter() - start)


async def replay(
    url: str, model: str, requests: Sequence[TraceRequest], timeout_s: float
) -> list[Outcome]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        t0 = time.perf_counter()

        async def at(req: TraceRequest) -> Outcome:
            delay = t0 + req.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            return await one_request(http, url, model, req, timeout_s)

        return list(await asyncio.gather(*(at(r) for r in requests)))


# ---------------------------------------------------------------- metrics


async def scrape(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
        text = await r.text()
    sums: dict[str, float] = {}
    info: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:cache_config_info":
                info = dict(s.labels)
            elif not s.name.endswith("_created"):
                sums[s.name] = sums.get(s.name, 0.0) + s.value
    return {"sums": sums, "cache_config": info}


def quantile(values: Sequence[float], q: float) -> float:
    """gpufleet.stats' percentile (numpy's linear, as every gpufleet figure); nan if none."""
    got = percentile(values, q * 100.0)
    return float("nan") if got is None else got


def max_over_mean(values: Sequence[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else float("nan")


@dataclass
class RunResult:
    router: str
    requests: int
    failed: int
    mean_ttft_s: float
    p99_ttft_s: float
    hit_rate: float
    hit_rate_vs_ideal: float
    max_mean_requests: float
    max_mean_prefill_tokens: float
    preemptions: int = 0
    requests_per_replica: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- one run


@dataclass
class Setup:
    args: argparse.Namespace
    logdir: Path
    cache_tokens: int | None = None
    block_size: int = 16


@dataclass
class Source:
    name: str
    requests: list[TraceRequest]
    ideal: float | None = None
    results: list[RunResult] = field(default_factory=list)


def replica_argv(args: argparse.Namespace, port: int, seed: int) -> list[str]:
    argv = gpufleet_argv(
        "replica",
        "--model",
        args.model,
        "--gpu",
        args.gpu,
        "--port",
        str(port),
        "--max-model-len",
        str(args.max_model_len),
        "--seed",
        str(seed),
        "--enable-prefix-caching",
        "--time-scale",
        str(args.time_scale),
    )
    if args.kv_blocks:
        argv += ["--num-gpu-blocks-override", str(args.kv_blocks)]
    return argv


def gateway_argv(kind: str, setup: Setup, urls: list[str], port: int) -> list[str]:
    """`gpufleet:POLICY` or `gpufleet:POLICY:{json options}` behind `gpufleet gateway`."""
    policy, _, raw = kind.split(":", 1)[1].partition(":")
    options: dict[str, Any] = json.loads(raw) if raw else {}
    if policy == "prefix_aware" and setup.cache_tokens:
        # What the replicas report (vllm:cache_config_info) sizes the index, as the
        # gateway's own scrape does; bytes per token stays the policy's default.
        options.setdefault("capacity_tokens", setup.cache_tokens)
    config = {
        "host": "127.0.0.1",
        "port": port,
        "policy": policy,
        "policy_options": options,
        "seed": 0,
        "replicas": [{"url": u} for u in urls],
    }
    path = setup.logdir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    extra = shlex.split(setup.args.gateway_args)
    return gpufleet_argv("gateway", "--config", str(path), "--log-level", "WARNING", *extra)


def router_argv(kind: str, setup: Setup, urls: list[str], port: int) -> list[str]:
    if kind.startswith("gpufleet:"):
        return gateway_argv(kind, setup, urls, port)
    from peers import peer_bin

    binary = str(peer_bin(kind, PEERS[kind]))
    # Each its own metrics port: the default may be taken by another router.
    common = [
        "--worker-urls",
        *urls,
        "--policy",
        "cache_aware",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
    ]
    if kind == "sglang-router":
        return [binary, "launch", *common, "--log-level", "warn"]
    return [binary, *common, "--log-level", "warning"]


async def run_one(kind: str, setup: Setup, source: Source) -> RunResult:
    args = setup.args
    procs: list[Proc] = []
    with cleanup(procs):
        ports = [free_port() for _ in range(args.replicas)]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for i, port in enumerate(ports):
            procs.append(spawn(f"replica{i}", replica_argv(args, port, seed=i), setup.logdir))
        for proc, url in zip(procs, urls, strict=True):
            await wait_ready(url + "/health", proc)
        if setup.cache_tokens is None:
            cfg = (await scrape(urls[0]))["cache_config"]
            blocks, setup.block_size = (
                int(cfg.get("num_gpu_blocks", 0)),
                int(cfg.get("block_size", 16)),
            )
            setup.cache_tokens = blocks * setup.block_size
        if source.ideal is None:
            blocks = (setup.cache_tokens or 0) // setup.block_size
            source.ideal = ideal_hit_rate(source.requests, setup.block_size, blocks * args.replicas)
        rport = free_port()
        name = kind.split(":{")[0].replace(":", "-")
        router = spawn(name, router_argv(kind, setup, urls, rport), setup.logdir)
        procs.append(router)
        rurl = f"http://127.0.0.1:{rport}"
        await wait_ready(rurl + "/v1/models", router)
        await asyncio.sleep(1.0)  # let routers finish their first health checks
        outcomes = await replay(rurl, args.served_model, source.requests, args.timeout_s)
        metrics = [(await scrape(u))["sums"] for u in urls]
    ok = [o for o in outcomes if o.ok]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]

    def total(name: str) -> list[float]:
        return [m.get(name, 0.0) for m in metrics]

    hits, queries = total("vllm:prefix_cache_hits_total"), total("vllm:prefix_cache_queries_total")
    hit_rate = sum(hits) / sum(queries) if sum(queries) else 0.0
    served = [int(v) for v in total("vllm:request_success_total")]
    return RunResult(
        router=kind,
        requests=len(outcomes),
        failed=len(outcomes) - len(ok),
        mean_ttft_s=sum(ttfts) / len(ttfts) if ttfts else float("nan"),
        p99_ttft_s=quantile(ttfts, 0.99),
        hit_rate=hit_rate,
        hit_rate_vs_ideal=hit_rate / source.ideal if source.ideal else float("nan"),
        max_mean_requests=max_over_mean(served),
        max_mean_prefill_tokens=max_over_mean([q - h for q, h in zip(queries, hits, strict=True)]),
        preemptions=int(sum(total("vllm:num_preemptions_total"))),
        requests_per_replica=served,
        errors=sorted({o.error for o in outcomes if o.error})[:5],
    )


def _mean_range(values: Sequence[float], fmt: str) -> str:
    mean = sum(values) / len(values)
    if len(values) == 1:
        return format(mean, fmt)
    return f"{format(mean, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def markdown(sources: Sequence[Source], setup: Setup) -> str:
    a = setup.args
    lines = [
        f"# routing_quality: {a.requests} requests per source from #{a.offset}, {a.speedup}x "
        f"pace, {a.replicas} x `gpufleet replica --model {a.model} --time-scale {a.time_scale}` "
        f"with {setup.cache_tokens} KV tokens each; TTFT in wall ms (engine time = wall / "
        f"time scale); {a.repeat} run(s) per router: mean (min–max)"
        + (f"; gateway flags `{a.gateway_args}`" if a.gateway_args else ""),
    ]
    for src in sources:
        lines += [
            "",
            f"## {source_label(src.name)}: one LRU cache of all replicas' blocks would hit "
            f"{src.ideal or 0:.3f} of prompt tokens",
            "",
            "| router | mean TTFT ms | p99 TTFT ms | hit rate | vs one cache | max/mean requests "
            "| max/mean prefill | preemptions | failed |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        kinds = list(dict.fromkeys(r.router for r in src.results))
        for kind in kinds:
            rs = [r for r in src.results if r.router == kind]
            lines.append(
                f"| {kind} | {_mean_range([r.mean_ttft_s * 1e3 for r in rs], '.0f')} "
                f"| {_mean_range([r.p99_ttft_s * 1e3 for r in rs], '.0f')} "
                f"| {_mean_range([r.hit_rate for r in rs], '.3f')} "
                f"| {_mean_range([r.hit_rate_vs_ideal for r in rs], '.3f')} "
                f"| {_mean_range([r.max_mean_requests for r in rs], '.3f')} "
                f"| {_mean_range([r.max_mean_prefill_tokens for r in rs], '.3f')} "
                f"| {sum(r.preemptions for r in rs)} | {sum(r.failed for r in rs)} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from gpufleet.routing import POLICY_NAMES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "sources",
        nargs="*",
        help="traces or synthetic:NAME (default: the shared Mooncake conversation slice)",
    )
    p.add_argument("--requests", type=int, default=600, help="slice length")
    p.add_argument("--offset", type=int, default=0, help="first request of the slice")
    p.add_argument("--speedup", type=float, default=8.0, help="replay at this x the pace")
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.25,
        help="replicas' wall seconds per engine second: speedup x time-scale is the load "
        "the replicas see relative to the trace (default 2x), in 1/speedup the wall time",
    )
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--model", default="Qwen/Qwen3-8B")
    p.add_argument("--served-model", default=None, help="name clients send (default --model)")
    p.add_argument("--gpu", default="h100-sxm")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument(
        "--kv-blocks",
        type=int,
        default=100_000,
        help="KV blocks per replica (100k x 16 = 1.6M tokens: enough that a few minutes of "
        "conversation reuse can fit across 4 replicas, so routing decides the hit rate); "
        "0 = what the replica plans for the GPU",
    )
    p.add_argument("--max-output-tokens", type=int, default=1024)
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--policies", default=",".join(POLICY_NAMES), help="gpufleet policies")
    p.add_argument(
        "--policy",
        action="append",
        default=[],
        help='one more gpufleet policy, NAME or NAME:{"option": value} (repeatable)',
    )
    p.add_argument("--peers", default="sglang-router,vllm-router", help="'' for none")
    p.add_argument("--repeat", type=int, default=1, help="runs per router and source")
    p.add_argument("--gateway-args", default="", help="extra `gpufleet gateway` flags")
    p.add_argument("--out", default=str(RESULTS / "routing_quality"), help="path without suffix")
    args = p.parse_args(argv)
    args.served_model = args.served_model or args.model
    if not args.sources:
        from gpufleet.errors import UserError

        try:
            args.sources = [default_trace()]
        except UserError as e:
            p.error(str(e))
    return args


async def main_async(args: argparse.Namespace) -> list[Source]:
    logdir = Path(tempfile.mkdtemp(prefix="routing_quality-"))
    setup = Setup(args, logdir)
    sources = []
    for name in args.sources:
        reqs = load_requests(name, args.offset, args.requests, args.speedup, args.max_output_tokens)
        tokens = sum(r.input_tokens for r in reqs)
        print(
            f"{source_label(name)}: {len(reqs)} requests over {reqs[-1].arrival_s:.0f}s, "
            f"{tokens / len(reqs):.0f} prompt tokens on average",
            flush=True,
        )
        sources.append(Source(name, reqs))
    kinds = [f"gpufleet:{p}" for p in args.policies.split(",") if p]
    kinds += [f"gpufleet:{p}" for p in args.policy]
    kinds += [p for p in args.peers.split(",") if p]
    print(f"logs in {logdir}", flush=True)
    for rep in range(args.repeat):
        for source in sources:
            for kind in kinds:
                t = time.perf_counter()
                try:
                    result = await run_one(kind, setup, source)
                except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
                    print(f"{kind}: FAILED to run: {e}", flush=True)
                    continue
                source.results.append(result)
                print(
                    f"[{rep + 1}/{args.repeat}] {source_label(source.name)} {kind:28s} ttft "
                    f"mean {result.mean_ttft_s * 1e3:7.0f} ms p99 {result.p99_ttft_s * 1e3:7.0f}"
                    f" ms  hit {result.hit_rate:.3f} ({result.hit_rate_vs_ideal:.3f} of one "
                    f"cache)  max/mean {result.max_mean_requests:.3f}  failed {result.failed}  "
                    f"[{time.perf_counter() - t:.0f}s]",
                    flush=True,
                )
    payload = {
        "args": vars(args),
        "cache_tokens_per_replica": setup.cache_tokens,
        "sources": [
            {"source": s.name, "ideal_hit_rate": s.ideal, "results": [asdict(r) for r in s.results]}
            for s in sources
        ],
    }
    peers = [k for k in kinds if k in PEERS]
    write_result(Path(args.out), payload, markdown(sources, setup), peers=peers)
    print(markdown(sources, setup))
    return sources


def main() -> None:
    asyncio.run(main_async(parse_args()))


if __name__ == "__main__":
    main()
