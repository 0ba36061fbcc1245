"""Does the live replica deliver the timing its engine model predicts, and how far does one
replica process go on one core?

Fidelity: closed loops of C concurrent streaming clients (C in 1, 16, 64, 256), each sending
its next request as soon as the previous one ends. The same closed loop is run offline
through the same pure engine (same config, same step-time model, same prompts) to get the
predicted mean TTFT and TPOT; the live replica's client-measured means must be within 5%.
Output lengths vary around their mean and each client's first request is a warm-up, so the
clients drift apart instead of running in lock-step waves (whose phase would shift the
means by ~10% from run to run). The client's own arrivals replayed through the engine are
reported beside it.

Ceiling: the same closed loop with more and more streams (explicit step-time constants so
the engine could go fast); the ceiling is the largest C whose TTFT and TPOT stay within 5%
of the prediction, with its streamed tokens/s (target >= 512 streams, >= 20,000 tokens/s).

The replica is pinned to core 0 and this client to core 1 (taskset / sched_setaffinity).
Results: benchmarks/results/replica_fidelity.{json,md}.

    .venv/bin/python benchmarks/replica_fidelity.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpufleet.engine import (
    BLOCKED_RETRY_S,
    Arrivals,
    Engine,
    EngineConfig,
    EngineDriver,
    EngineRequest,
    run_virtual,
)
from gpufleet.perf.step_time import LinearStepTimeModel, StepTimeModel
from gpufleet.plan.profile import replica_profile
from gpufleet.tokenizer import default_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write_result

MODEL = "meta-llama/Llama-3.1-8B"  # the ceiling runs (explicit step times)
LAYOUT_MODEL = "meta-llama/Llama-3.1-70B"  # the fidelity runs: 70B on 4 x H100 (TP=4)
# GPUFLEET_BENCH_PIN=0 lets the OS place both processes (pinned by default).
PIN = os.environ.get("GPUFLEET_BENCH_PIN", "1") == "1"
# On a shared machine, a higher priority keeps other processes' time slices out of the
# measured latencies (root only; 0 turns it off).
NICE = int(os.environ.get("GPUFLEET_BENCH_NICE", "-10" if os.geteuid() == 0 else "0"))
_CLI = "import sys; from gpufleet.cli import main; sys.argv[0] = 'gpufleet'; main()"


@dataclass
class Scenario:
    name: str
    model: str
    concurrency: int
    requests_per_client: int
    prompt_tokens: int
    output_tokens: int  # mean output length
    flags: list[str]  # replica flags besides --model/--port
    step_time: StepTimeModel
    engine_config: EngineConfig
    # Output lengths vary by +-spread/2 around output_tokens (0: all equal), so that clients
    # drift apart instead of arriving in waves; the first `warmup` requests of every client
    # are left out of the means (both predicted and measured).
    output_spread: float = 0.0
    warmup: int = 0

    def output_len(self, client: int, k: int) -> int:
        if not self.output_spread:
            return self.output_tokens
        frac = ((client * 7919 + k * 104729) * 0.6180339887) % 1.0
        return max(
            2, round(self.output_tokens * (1 - self.output_spread / 2 + self.output_spread * frac))
        )

    def prompt_index(self, client: int, k: int) -> int:
        return client * 100_000 + k


@dataclass
class Row:
    scenario: str
    concurrency: int
    requests: int
    predicted_ttft_s: float
    measured_ttft_s: float
    ttft_err: float
    predicted_tpot_s: float
    measured_tpot_s: float
    tpot_err: float
    tokens_per_s: float
    wall_s: float
    ok: bool
    load_avg_1m: float
    # The replica's own view (/metrics, all requests, warm-up included) beside the model's:
    # the gap between this and the client's is network and OS scheduling, not the replica.
    predicted_ttft_all_s: float
    server_ttft_all_s: float
    # The engine replaying the very arrivals the client made. It sets a request's arrival at
    # the client's send time, which trails the engine's schedule by whatever the replica
    # was late in delivering the previous token; so near the ceiling it reads below the
    # live TTFT by that lag, which the closed-loop prediction above does not charge.
    replay_ttft_s: float = 0.0
    replay_tpot_s: float = 0.0


def prompt_ids(index: int, n: int) -> list[int]:
    return default_tokenizer().word_ids_for_seed(1_000_003 + index, n)


# --------------------------------------------------------------------------- prediction
def predict(sc: Scenario) -> tuple[float, float, float]:
    """Mean TTFT and TPOT of the closed loop, run through the pure engine offline, and the
    mean TTFT of all requests (warm-up included, to set beside the replica's /metrics).

    Live, the replica starts computing step k+1 as soon as step k's tokens are out, so a
    request sent on receiving its predecessor's last token joins step k+2; the same here
    (the engine-driver contract, with clients that answer after the next step began).
    """
    engine = Engine(sc.engine_config, sc.step_time, seed=0)
    driver = EngineDriver(engine)
    sent_count = dict.fromkeys(range(sc.concurrency), 0)
    owner: dict[str, tuple[int, int]] = {}
    done: list[EngineRequest] = []
    all_ttft_s: list[float] = []

    def send(client: int, arrival_s: float) -> None:
        k = sent_count[client]
        sent_count[client] = k + 1
        rid = f"c{client}k{k}"
        prompt = prompt_ids(sc.prompt_index(client, k), sc.prompt_tokens)
        req = EngineRequest(rid, prompt, sc.output_len(client, k))
        req.arrival_s = arrival_s
        owner[rid] = (client, k)
        driver.submit(req, arrival_s)

    for c in range(sc.concurrency):
        send(c, 0.0)
    pending: list[int] = []
    while engine.has_work or pending:
        if not engine.has_work:
            for c in pending:
                send(c, engine.now_s)
            pending = []
        before_s = engine.now_s
        out = driver.begin()
        for c in pending:  # they arrived while this step was already running
            send(c, before_s)
        pending = []
        if out is None:  # blocked: try again a little later, as the runner does
            engine.advance_to(engine.now_s + BLOCKED_RETRY_S)
            continue
        for req in out.finished:
            c, k = owner[req.request_id]
            all_ttft_s.append(req.first_token_s - req.arrival_s)  # type: ignore[operator]
            if k >= sc.warmup:
                done.append(req)
            if sent_count[c] < sc.requests_per_client:
                pending.append(c)
    ttft = [r.first_token_s - r.arrival_s for r in done]  # type: ignore[operator]
    tpot = [
        (r.finished_s - r.first_token_s) / (r.num_output_tokens - 1)  # type: ignore[operator]
        for r in done
    ]
    return sum(ttft) / len(ttft), sum(tpot) / len(tpot), sum(all_ttft_s) / len(all_ttft_s)


def predict_same_arrivals(
    sc: Scenario, arrivals: list[tuple[float, int, int]]
) -> tuple[float, float]:
    """Mean TTFT and TPOT the pure engine predicts for the requests the live client sent,
    at the times it sent them ((seconds after start, client, k)): the same load, replayed.

    A request that arrives during a step joins the next one, as in the live runner.
    """
    engine = Engine(sc.engine_config, sc.step_time, seed=0)
    sends: Arrivals[tuple[int, int]] = Arrivals()
    for t, c, k in sorted(arrivals):
        sends.add(t, (c, k))
    owner: dict[str, int] = {}
    done: list[EngineRequest] = []

    def admit(t: float, client_k: tuple[int, int]) -> EngineRequest:
        c, k = client_k
        req = EngineRequest(
            f"c{c}k{k}", prompt_ids(sc.prompt_index(c, k), sc.prompt_tokens), sc.output_len(c, k)
        )
        req.arrival_s = t
        owner[req.request_id] = k
        return req

    for out in run_virtual(EngineDriver(engine), sends, admit):
        done.extend(r for r in out.finished if owner[r.request_id] >= sc.warmup)
    ttft = [r.first_token_s - r.arrival_s for r in done]  # type: ignore[operator]
    tpot = [
        (r.finished_s - r.first_token_s) / (r.num_output_tokens - 1)  # type: ignore[operator]
        for r in done
    ]
    return sum(ttft) / len(ttft), sum(tpot) / len(tpot)


# --------------------------------------------------------------------------- live
class Replica:
    def __init__(self, flags: list[str], model: str = MODEL):
        cmd = [sys.executable, "-c", _CLI, "replica", "--model", model, "--port", "0", *flags]
        if PIN and shutil.which("taskset") and (os.cpu_count() or 1) > 1:
            cmd = ["taskset", "-c", "0", *cmd]
        if NICE and shutil.which("nice"):
            cmd = ["nice", "-n", str(NICE), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"http://([\d.]+):(\d+)", line)
        if match is None:
            self.stop()
            raise RuntimeError(f"replica did not start: {line!r}")
        self.host, self.port = match.group(1), int(match.group(2))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class _StreamProtocol(asyncio.Protocol):
    """Timestamps the chunks of one response as they arrive, in the transport's callback:
    no coroutine wakes up per chunk, so the measuring side stays cheap at hundreds of
    streams (aiohttp's client costs more per chunk than the replica does)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[tuple[float, float]] | None = None
        self.first = self.last = 0.0
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if b'"text":"' in data:
            if not self.first:
                self.first = now
            self.last = now
        self.tail = (self.tail + data)[-64:]
        # the terminating chunk of the chunked body, after [DONE]
        finished = self.tail.endswith(b"\r\n0\r\n\r\n") and b"[DONE]" in self.tail
        if finished and self.done is not None and not self.done.done():
            self.done.set_result((self.first, self.last))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(RuntimeError("connection closed before the end of a response"))


class Connection:
    """A raw keep-alive HTTP/1.1 client connection for streamed completions."""

    def __init__(self, host: str, port: int, model: str = MODEL):
        self.host, self.port, self.model = host, port, model
        self.protocol: _StreamProtocol | None = None

    def request_bytes(self, prompt: str, max_tokens: int) -> bytes:
        body = json.dumps(
            {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        return head + body

    async def stream(self, prompt: str, max_tokens: int) -> tuple[float, float, float]:
        """(send time, first token time, last token time) of one streamed completion."""
        return await self.send(self.request_bytes(prompt, max_tokens))

    async def send(self, request: bytes) -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        if self.protocol is None:
            _, self.protocol = await loop.create_connection(_StreamProtocol, self.host, self.port)
        p = self.protocol
        assert p.transport is not None
        p.first = p.last = 0.0
        p.tail = b""
        p.done = loop.create_future()
        sent = time.monotonic()
        p.transport.write(request)
        first, last = await p.done
        return sent, first, last

    def close(self) -> None:
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.close()


async def closed_loop(sc: Scenario, host: str, port: int, deadline_s: float) -> dict[str, Any]:
    tok = default_tokenizer()
    # Every request body is built before the clock starts.
    requests = [
        [
            Connection(host, port, sc.model).request_bytes(
                tok.decode(prompt_ids(sc.prompt_index(c, k), sc.prompt_tokens)),
                sc.output_len(c, k),
            )
            for k in range(sc.requests_per_client)
        ]
        for c in range(sc.concurrency)
    ]
    # One throwaway request first, so that the replica process's first-call costs (lazy
    # imports, first allocations) are not in the measured means; its prompt shares no
    # block with the measured ones, and its KV is freed before they start.
    warm = Connection(host, port, sc.model)
    await warm.send(warm.request_bytes(tok.decode(prompt_ids(-1, sc.prompt_tokens)), 2))
    warm.close()
    tokens = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    arrivals: list[tuple[float, int, int]] = []
    start = time.monotonic()

    async def client(c: int) -> None:
        nonlocal tokens
        conn = Connection(host, port, sc.model)
        try:
            for k in range(sc.requests_per_client):
                if time.monotonic() > deadline_s:
                    return
                n = sc.output_len(c, k)
                sent, first, last = await conn.send(requests[c][k])
                arrivals.append((sent - start, c, k))
                tokens += n
                if k >= sc.warmup:
                    ttfts.append(first - sent)
                    tpots.append((last - first) / (n - 1))
        finally:
            conn.close()

    await asyncio.gather(*(client(c) for c in range(sc.concurrency)))
    wall = time.monotonic() - start
    return {
        "ttft": sum(ttfts) / len(ttfts),
        "tpot": sum(tpots) / len(tpots),
        "n": len(ttfts),
        "tokens_per_s": tokens / wall,
        "wall": wall,
        "arrivals": arrivals,
    }


def server_mean_ttft_s(host: str, port: int) -> float:
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:time_to_first_token_seconds":
            for sample in family.samples:
                if sample.name.endswith("_sum"):
                    total = sample.value
                elif sample.name.endswith("_count"):
                    count = sample.value
    return total / count if count else float("nan")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:
        return asyncio.new_event_loop


def run(sc: Scenario, tolerance: float) -> Row:
    predicted_ttft, predicted_tpot, predicted_ttft_all = predict(sc)
    rep = Replica(sc.flags, sc.model)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            measured = runner.run(closed_loop(sc, rep.host, rep.port, time.monotonic() + 120))
        server_ttft = server_mean_ttft_s(rep.host, rep.port)
    finally:
        rep.stop()
    replay_ttft, replay_tpot = predict_same_arrivals(sc, measured["arrivals"])
    ttft_err = measured["ttft"] / predicted_ttft - 1
    tpot_err = measured["tpot"] / predicted_tpot - 1
    return Row(
        scenario=sc.name,
        concurrency=sc.concurrency,
        requests=int(measured["n"]),
        predicted_ttft_s=predicted_ttft,
        measured_ttft_s=measured["ttft"],
        ttft_err=ttft_err,
        predicted_tpot_s=predicted_tpot,
        measured_tpot_s=measured["tpot"],
        tpot_err=tpot_err,
        tokens_per_s=measured["tokens_per_s"],
        wall_s=measured["wall"],
        ok=abs(ttft_err) <= tolerance and abs(tpot_err) <= tolerance,
        load_avg_1m=os.getloadavg()[0],
        predicted_ttft_all_s=predicted_ttft_all,
        server_ttft_all_s=server_ttft,
        replay_ttft_s=replay_ttft,
        replay_tpot_s=replay_tpot,
    )


def layout_scenario(c: int, quick: bool) -> Scenario:
    max_num_seqs = 256
    profile = replica_profile(
        LAYOUT_MODEL, "h100-sxm", tp=4, max_num_seqs=max_num_seqs, max_model_len=8192
    )
    cfg = EngineConfig.of_replica(profile)
    per_client = {1: 20, 16: 7, 64: 4, 256: 3}[c]
    if quick:
        per_client = max(1, per_client // 2)
    return Scenario(
        name="llama-3.1-70b tp4/h100 layout",
        model=LAYOUT_MODEL,
        concurrency=c,
        requests_per_client=per_client,
        prompt_tokens=1024,
        output_tokens=64,
        output_spread=0.5,
        warmup=1,
        flags=["--gpu", "h100-sxm", "--tp", "4", "--max-num-seqs", str(max_num_seqs)],
        step_time=profile.step_time_model,
        engine_config=cfg,
    )


def ceiling_scenario(c: int) -> Scenario:
    # Explicit constants: ~20 ms per decode iteration at 512 sequences (the model would
    # allow ~25,000 tokens/s there); past that the replica process is what limits.
    base_s, per_seq_s = 0.004, 3e-5
    step = LinearStepTimeModel(base_s=base_s, per_token_s=1e-6, per_seq_s=per_seq_s)
    cfg = EngineConfig(
        num_gpu_blocks=200_000, max_num_seqs=4096, max_num_batched_tokens=16384, max_model_len=8192
    )
    spec = f"base_s={base_s},per_token_s=1e-6,per_seq_s={per_seq_s}"
    return Scenario(
        name="ceiling (explicit step time)",
        model=MODEL,
        concurrency=c,
        requests_per_client=3,
        prompt_tokens=128,
        output_tokens=128,
        output_spread=1.0,
        warmup=1,
        flags=[
            "--step-time",
            spec,
            "--max-num-seqs",
            "4096",
            "--max-num-batched-tokens",
            "16384",
            "--num-gpu-blocks-override",
            "200000",
        ],
        step_time=step,
        engine_config=cfg,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests per client")
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64, 256])
    ap.add_argument("--ceiling", type=int, nargs="*", default=[256, 512, 640, 768, 1024])
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args()
    if PIN and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})  # the client on core 1, the replica on core 0
    if NICE:
        os.nice(NICE)
    rows: list[Row] = []
    for c in args.concurrency:
        rows.append(run(layout_scenario(c, args.quick), args.tolerance))
        print(rows[-1], flush=True)
    ceiling: Row | None = None
    for c in args.ceiling:
        row = run(ceiling_scenario(c), args.tolerance)
        rows.append(row)
        print(row, flush=True)
        if not row.ok:
            break
        ceiling = row
    result = {
        "rows": [asdict(r) for r in rows],
        "ceiling": asdict(ceiling) if ceiling else None,
        "tolerance": args.tolerance,
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "nice": NICE,
        "pinned": PIN,
    }
    lines = [
        "| scenario | C | requests | TTFT pred (ms) | TTFT live (ms) | err | TPOT pred (ms) "
        "| TPOT live (ms) | err | tokens/s | within tol | load 1m | TTFT all: pred / replica (ms) "
        "| same arrivals replayed: TTFT / TPOT (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: "
        "| ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.concurrency} | {r.requests} | {r.predicted_ttft_s * 1e3:.1f} "
            f"| {r.measured_ttft_s * 1e3:.1f} | {r.ttft_err:+.1%} | {r.predicted_tpot_s * 1e3:.2f} "
            f"| {r.measured_tpot_s * 1e3:.2f} | {r.tpot_err:+.1%} | {r.tokens_per_s:,.0f} "
            f"| {'yes' if r.ok else 'NO'} | {r.load_avg_1m:.1f} "
            f"| {r.predicted_ttft_all_s * 1e3:.1f} / {r.server_ttft_all_s * 1e3:.1f} "
            f"| {r.replay_ttft_s * 1e3:.1f} / {r.replay_tpot_s * 1e3:.2f} |"
        )
    if ceiling:
        lines.append(
            f"\nCeiling: {ceiling.concurrency} streams, {ceiling.tokens_per_s:,.0f} tokens/s "
            f"within {args.tolerance:.0%}."
        )
    write_result("replica_fidelity", result, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
