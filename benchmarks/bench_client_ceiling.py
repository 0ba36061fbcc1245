"""How many streamed requests per second can `gpufleet bench` drive on one core?

Runs a no-delay stub (a raw asyncio HTTP/1.1 server written here, answering every POST
with one precomputed SSE stream of N token events + usage + [DONE]) in its own
process(es), then runs `gpufleet bench` pinned to one CPU core against it: closed loop as
fast as it goes, then open loop at 1,000 requests/s, both with the whole stream in one
write and with one write per event (--gap-ms apart, so one network read per token). It
reports requests/s, the client's CPU use and its own timing overhead (event-loop lag, and
how far sends fell behind the arrival schedule).
Writes JSON and a markdown table under benchmarks/results/.

    .venv/bin/python benchmarks/bench_client_ceiling.py [--requests 6000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RAW, write_result


def _sse_events(tokens: int) -> list[bytes]:
    events = []
    for i in range(tokens):
        last = i == tokens - 1
        chunk = {
            "id": "cmpl-0",
            "object": "text_completion",
            "created": 0,
            "model": "stub",
            "choices": [
                {"index": 0, "text": f" w{i}", "finish_reason": "length" if last else None}
            ],
        }
        events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}
    events.append(
        b"data: " + json.dumps({"id": "cmpl-0", "choices": [], "usage": usage}).encode() + b"\n\n"
    )
    events.append(b"data: [DONE]\n\n")
    return events


class _StubProtocol(asyncio.Protocol):
    """Minimal keep-alive HTTP/1.1: reads a request (headers + Content-Length body), answers.

    With gap_s = 0 the whole stream goes out in one write; otherwise one event per write,
    gap_s apart (so the client sees one network read per token, as from a real server).
    """

    def __init__(self, head: bytes, events: list[bytes], gap_s: float):
        self.head = head
        self.events = events
        self.response = head + b"".join(events)
        self.gap_s = gap_s
        self.buf = b""
        self.transport: Any = None

    def _send_from(self, i: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(self.events[i])
        if i + 1 < len(self.events):
            asyncio.get_running_loop().call_later(self.gap_s, self._send_from, i + 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's transports are not asyncio.Transport instances

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            length = 0
            pos = head.find(b"content-length:")
            if pos >= 0:
                line_end = head.find(b"\r\n", pos)
                length = int(head[pos + 15 : line_end if line_end >= 0 else None])
            total = head_end + 4 + length
            if len(self.buf) < total:
                return
            self.buf = self.buf[total:]
            if self.gap_s <= 0:
                self.transport.write(self.response)
            else:
                self.transport.write(self.head)
                self._send_from(0)


def serve_stub(port: int, tokens: int, gap_s: float) -> None:
    """Run the stub until killed (one process; several share the port via SO_REUSEPORT)."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    events = _sse_events(tokens)
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        + f"Content-Length: {sum(len(e) for e in events)}\r\n\r\n".encode()
    )

    async def main() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _StubProtocol(head, events, gap_s), sock=sock, backlog=1024
        )
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"stub on port {port} did not come up")


def run_client(
    port: int, client_cpu: int, load: list[str], requests: int, tokens: int
) -> dict[str, Any]:
    out_json = RAW / "client_ceiling_run.json"
    gpufleet = Path(sys.executable).parent / "gpufleet"
    cmd = [
        "taskset", "-c", str(client_cpu), str(gpufleet), "bench",
        "--url", f"http://127.0.0.1:{port}", "--model", "stub", "--no-scrape", "--quiet",
        *load, "--num-requests", str(requests),
        "--input-tokens", "8", "--output-tokens", str(tokens), "--json", str(out_json),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"gpufleet bench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    run = json.loads(out_json.read_text())
    m, c = run["metrics"], run["client_overhead"]
    return {
        "command": shlex.join(cmd),
        "load": " ".join(load),
        "completed": m["completed"],
        "failed": m["failed"],
        "requests_per_s": m["request_throughput"],
        "token_events_per_s": m["output_throughput"],
        "client_cpu_cores": c["cpu_util"],
        # CPU efficiency, which a busy shared machine does not distort: what one fully
        # available core would sustain.
        "requests_per_cpu_s": m["completed"] / max(c["cpu_util"] * m["duration"], 1e-9),
        "loop_lag_mean_ms": c["loop_lag_mean_ms"],
        "loop_lag_p99_ms": c["loop_lag_p99_ms"],
        "schedule_lag_mean_ms": c["schedule_lag_mean_ms"],
        "schedule_lag_p99_ms": c["schedule_lag_p99_ms"],
        "mean_ttft_ms": m["mean_ttft_ms"],
        "mean_e2el_ms": m["mean_e2el_ms"],
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rate", type=float, default=1000.0, help="open-loop scenario's rate")
    ap.add_argument("--tokens", type=int, default=8, help="token events per streamed response")
    ap.add_argument("--stub-procs", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=0, help="core the client is pinned to")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="event gap in the streamed scenario")
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve_stub(args.serve, args.tokens, args.gap_ms / 1000)
        return

    RAW.mkdir(parents=True, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu = args.client_cpu if args.client_cpu in cpus else cpus[0]
    stub_cpus = [c for c in cpus if c != client_cpu] or cpus
    ports = {0.0: free_port(), args.gap_ms: free_port()}
    stubs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve",
                str(port),
                "--tokens",
                str(args.tokens),
                "--gap-ms",
                str(gap_ms),
            ],
            preexec_fn=lambda: os.sched_setaffinity(0, stub_cpus),
        )
        for gap_ms, port in ports.items()
        for _ in range(args.stub_procs)
    ]
    rate = ["--rate", f"{args.rate:g}", "--burstiness", "1"]
    scenarios = [  # (event gap of the stub in ms, load)
        (0.0, ["--concurrency", str(args.concurrency)]),  # as fast as the client can go
        (0.0, rate),  # the target load, open loop, whole stream in one read
        (args.gap_ms, rate),  # the target load with one read per token event
    ]
    try:
        for port in ports.values():
            wait_port(port)
        rows = []
        for gap_ms, load in scenarios:
            row = run_client(ports[gap_ms], client_cpu, load, args.requests, args.tokens)
            row["stub_event_gap_ms"] = gap_ms
            rows.append(row)
    finally:
        for s in stubs:
            s.kill()
            s.wait(timeout=10)
    result = {
        "client": {"cpus": len(cpus), "client_cpu": client_cpu},
        "stub": {"processes": args.stub_procs, "cpus": stub_cpus, "token_events": args.tokens},
        "target_requests_per_s": 1000,
        "runs": rows,
    }
    lines = [
        "| client (1 core) | load | stub event gap (ms) | requests | req/s | token events/s "
        "| client CPU (cores) | req per client CPU-s | loop lag mean / p99 (ms) "
        "| send lag mean / p99 (ms) | failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| gpufleet bench | {r['load']} | {r['stub_event_gap_ms']:g} | {r['completed']} "
            f"| {r['requests_per_s']:.0f} "
            f"| {r['token_events_per_s']:.0f} | {r['client_cpu_cores']:.2f} "
            f"| {r['requests_per_cpu_s']:.0f} "
            f"| {r['loop_lag_mean_ms']:.2f} / {r['loop_lag_p99_ms']:.2f} "
            f"| {_ms(r['schedule_lag_mean_ms'])} / {_ms(r['schedule_lag_p99_ms'])} | {r['failed']} |"
        )
    table = "\n".join(lines) + "\n"
    write_result("client_ceiling", result, table)
    print(table)
    for r in rows:
        print(f"command: {r['command']}")
    best = rows[0]["requests_per_s"]
    per_cpu = min(r["requests_per_cpu_s"] for r in rows)
    verdict = "meets" if best >= 1000 else "MISSES"
    print(f"{verdict} the 1,000 streamed requests/s target on one core ({best:.0f} req/s); "
          f"CPU cost: at least {per_cpu:.0f} requests per client CPU-second in every scenario; "
          f"load average {os.getloadavg()[0]:.1f} on {len(cpus)} CPUs")  # fmt: skip


if __name__ == "__main__":
    main()
