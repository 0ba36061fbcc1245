"""Holding many slow streams: N concurrent streams at 2 tokens/s through one proxy.

    python benchmarks/many_streams.py [--streams 10000] [--tokens 40] [--interval-ms 500]
        [--peers gpufleet:1,gpufleet:2,sglang-router,vllm-router] [--workers 2] [--pin]

Two lean slow backends (`gpufleet.bench.slow_stub`: one timer for all streams) stand in
for two replicas; each proxy is started in turn in front of both; a lean client process
opens the N streams (ramped over a few seconds), each asking for `--tokens` tokens, so
that all N are open at once for most of the run. Reported per proxy: streams completed
(saw [DONE]) and failed, TTFB p50/p99 (request sent -> first byte back), the proxy's peak
RSS (the process and its children: every worker), its CPU seconds and CPU µs per relayed
event (CPU / events the client received), read from /proc.

By default every process shares both cores, as a gateway with workers needs; with `--pin`
the proxy has CPU 1 and the client and backends share CPU 0 (a one-process proxy).
One process may hold at most `ulimit -n` sockets (20,000 here): a single-process proxy
needs two per stream, so past ~9,990 streams only a proxy with several processes
(`gpufleet gateway --workers 2`) can hold them all; the table says what each got.
Results: benchmarks/results/many_streams.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gateway_overhead import cpu_seconds, free_port, start, stop  # noqa: E402
from gpufleet.stats import percentile  # noqa: E402
from peers import PEER_VERSIONS, rust_router_argv  # noqa: E402
from record import write_result  # noqa: E402

MODEL = "stub-model"


# -- the lean client (its own process: `--client`) -------------------------------------------
class _Stream:
    __slots__ = ("buf_tail", "done", "events", "sent_s", "ttfb_s")

    def __init__(self) -> None:
        self.sent_s = 0.0
        self.ttfb_s: float | None = None
        self.events = 0
        self.done = False
        self.buf_tail = b""


async def _client(host: str, port: int, n: int, tokens: int, ramp_s: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": tokens, "stream": True}).encode()  # fmt: skip
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
               b"\r\nContent-Length: %d\r\n\r\n%s") % (len(body), body)  # fmt: skip
    streams = [_Stream() for _ in range(n)]
    finished = asyncio.Event()
    left = [n]

    class Proto(asyncio.Protocol):
        def __init__(self, s: _Stream) -> None:
            self.s = s

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport
            self.s.sent_s = time.monotonic()
            transport.write(request)  # type: ignore[attr-defined]

        def data_received(self, data: bytes) -> None:
            s = self.s
            if s.ttfb_s is None:
                s.ttfb_s = time.monotonic() - s.sent_s
            s.events += data.count(b"data:")
            if b"[DONE]" in s.buf_tail + data:
                s.done = True
                self.t.close()
            s.buf_tail = data[-8:]

        def connection_lost(self, exc: Exception | None) -> None:
            left[0] -= 1
            if left[0] == 0:
                finished.set()

    errors: list[str] = []

    async def open_one(s: _Stream) -> None:
        try:
            await loop.create_connection(lambda: Proto(s), host, port)
        except OSError as exc:
            errors.append(repr(exc))
            left[0] -= 1
            if left[0] == 0:
                finished.set()

    t0 = time.monotonic()
    opening = set()
    for i, s in enumerate(streams):
        await asyncio.sleep(max(0.0, t0 + ramp_s * i / n - time.monotonic()))
        task = loop.create_task(open_one(s))
        opening.add(task)
        task.add_done_callback(opening.discard)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(finished.wait(), timeout=ramp_s + tokens + 120)
    ttfb = [s.ttfb_s for s in streams if s.ttfb_s is not None]
    return {
        "streams": n,
        "completed": sum(s.done for s in streams),
        "failed": sum(not s.done for s in streams),
        "connect_errors": len(errors),
        "events": sum(s.events for s in streams),
        "ttfb_p50_ms": 1000 * (percentile(ttfb, 50) or float("nan")),
        "ttfb_p99_ms": 1000 * (percentile(ttfb, 99) or float("nan")),
        "wall_s": time.monotonic() - t0,
        "error_example": errors[0] if errors else None,
    }


# -- processes ------------------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    """VmRSS of a process and its descendants."""
    total, todo = 0, [pid]
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(text[text.rindex(")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        todo.extend(children.get(p, []))
    return total


def proxy_argv(name: str, port: int, upstreams: list[str], workers: int,
               src: str | None = None) -> list[str]:  # fmt: skip
    if name.startswith("gpufleet"):
        # `src`: another checkout's src/ (before/after comparisons: --gpufleet-src)
        boot = f"import sys; sys.path.insert(0, {src!r}); " if src else ""
        args = [sys.executable, "-c", boot + "from gpufleet.cli import main; main()", "gateway",
                "--port", str(port), "--policy", "round_robin", "--log-level", "WARNING"]  # fmt: skip
        if workers > 1:
            args += ["--workers", str(workers)]
        for u in upstreams:
            args += ["--replica", u]
        return args
    if name in ("sglang-router", "vllm-router"):
        return rust_router_argv(name, port, upstreams)
    raise ValueError(name)


def wait_streaming(url: str, timeout_s: float = 120.0) -> None:
    import urllib.request

    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 1, "stream": True}).encode()  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=5) as resp:
                if b"[DONE]" in resp.read():
                    return
        time.sleep(0.3)
    raise RuntimeError(f"{url} does not stream")


def run_peer(args: argparse.Namespace, peer: str, backends: list[str], tmp: Path,
             cpus: tuple[str | None, str | None]) -> dict[str, Any]:  # fmt: skip
    load_cpu, proxy_cpu = cpus
    port = free_port()
    peer, _, n_workers = peer.partition(":")  # "gpufleet:2": that many workers
    workers = int(n_workers) if n_workers else args.workers if peer == "gpufleet" else 1
    src = args.gpufleet_src if peer == "gpufleet-src" else None
    proc = None
    if peer == "direct":  # the client straight to one backend: the floor for TTFB
        port = int(backends[0].rsplit(":", 1)[1])
    else:
        argv = proxy_argv(peer, port, backends, workers, src)
        proc = start(argv, proxy_cpu, tmp / f"{peer}.log")
    row: dict[str, Any] = {"peer": peer, "workers": workers}
    try:
        wait_streaming(f"http://127.0.0.1:{port}")
        overflows0 = listen_overflows()
        cpu0 = cpu_seconds(proc.pid) if proc else 0.0
        client = subprocess.Popen(
            _pin(
                [
                    sys.executable,
                    __file__,
                    "--client",
                    str(port),
                    str(args.streams),
                    str(args.tokens),
                    str(args.ramp_s),
                ],
                load_cpu,
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        peak = 0
        while client.poll() is None:
            peak = max(peak, rss_bytes(proc.pid) if proc else 0)
            time.sleep(0.5)
        out = json.loads(client.stdout.read() if client.stdout else "{}")
        row.update(out)
        # Connections the kernel refused for a full accept queue (SYN retried 1, 3, 7 s on).
        row["listen_overflows"] = listen_overflows() - overflows0
        if proc is not None:
            cpu = cpu_seconds(proc.pid) - cpu0
            row["rss_peak_mib"] = peak / 2**20
            row["proxy_cpu_s"] = cpu
            row["cpu_us_per_event"] = 1e6 * cpu / out["events"] if out.get("events") else None
    except Exception as exc:  # one peer failing must not lose the others
        row["error"] = repr(exc)
    finally:
        if proc is not None:
            stop(proc)
    print(json.dumps(row), flush=True)
    return row


def listen_overflows() -> int:
    """The kernel's count of connections dropped for a full listen queue (all sockets)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table.get("ListenOverflows", 0))
    return 0


def _pin(argv: list[str], cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu, *argv] if cpu is not None else argv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=10000)
    ap.add_argument("--tokens", type=int, default=40, help="per stream (20 s at 2 tokens/s)")
    ap.add_argument("--interval-ms", type=float, default=500.0)
    ap.add_argument("--ramp-s", type=float, default=8.0)
    ap.add_argument("--workers", type=int, default=2, help="gpufleet gateway --workers")
    ap.add_argument("--peers", default="gpufleet:1,gpufleet:2,sglang-router,vllm-router",
                    help="'gpufleet:N': the gateway with N workers (plain: --workers)")  # fmt: skip
    ap.add_argument("--pin", action="store_true", help="proxy on CPU 1, the rest on CPU 0")
    ap.add_argument(
        "--gpufleet-src",
        default=None,
        help="peer 'gpufleet-src': the gateway of another checkout's src/",
    )
    ap.add_argument("--out", default="many_streams")
    args = ap.parse_args()
    pin = args.pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    cpus = ("0", "1") if pin else (None, None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="many-streams-") as tmp_name:
        tmp = Path(tmp_name)
        stubs = []
        urls = []
        for i in range(2):
            port = free_port()
            argv = [sys.executable, "-m", "gpufleet.bench.slow_stub", "--port", str(port),
                    "--interval-ms", str(args.interval_ms), "--model", MODEL]  # fmt: skip
            stubs.append(start(argv, cpus[0], tmp / f"stub{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        try:
            for url in urls:
                wait_streaming(url)
            for peer in args.peers.split(","):
                rows.append(run_peer(args, peer, urls, tmp, cpus))
        finally:
            for proc in stubs:
                stop(proc)
    write(rows, args)


def write(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    lines = ["| proxy | streams | completed | failed | TTFB p50 ms | TTFB p99 ms | peak RSS MiB "
             "| proxy CPU s | CPU µs / event | listen overflows |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        name = r["peer"] + (f" ({r['workers']} workers)" if r.get("workers", 1) > 1 else "")
        if "error" in r:
            lines.append(f"| {name} | {args.streams} | error: {r['error'][:80]} ||||||||")
            continue
        us, rss, cpu = r.get("cpu_us_per_event"), r.get("rss_peak_mib"), r.get("proxy_cpu_s")
        lines.append(f"| {name} | {r['streams']} | {r['completed']} | {r['failed']} | "
                     f"{r['ttfb_p50_ms']:.1f} | {r['ttfb_p99_ms']:.1f} | "
                     f"{'' if rss is None else f'{rss:.0f}'} | {'' if cpu is None else f'{cpu:.1f}'} | "
                     f"{'' if us is None else f'{us:.1f}'} | {r.get('listen_overflows', '')} |")  # fmt: skip
    setup = {"streams": args.streams, "tokens": args.tokens, "interval_ms": args.interval_ms,
             "ramp_s": args.ramp_s}  # fmt: skip
    peers = [p for p in args.peers.split(",") if p in PEER_VERSIONS]
    write_result(args.out, {"setup": setup, "rows": rows}, "\n".join(lines), peers=peers)
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.install()
        port, n, tokens, ramp = sys.argv[2:6]
        print(json.dumps(asyncio.run(_client("127.0.0.1", int(port), int(n), int(tokens),
                                             float(ramp)))))  # fmt: skip
    else:
        main()
