"""What the gateway adds over direct access, beside sglang-router, vllm-router and nginx.

    python benchmarks/gateway_overhead.py [--requests 3000] [--replica-requests 1000]
        [--backends stub,replica] [--concurrency 1,32] [--rounds 3]
        [--peers direct,gpufleet,sglang-router,vllm-router,nginx] [--no-pin]

In one run, on the same backends, each proxy is started in turn in front of two backends
and driven by a closed-loop load generator (N clients on keep-alive connections, each
sending its next request when the last one finished), streaming and not. Reported per
backend and peer: requests/s, p50/p99 end-to-end latency and TTFT (time to the first
response chunk), what each proxy adds over direct access (p50 difference), and the
proxy's CPU time per request and, streamed, per relayed SSE event (proxy CPU / events the
clients received: request costs included, spread over the answer's 18 events). Peers run
in a rotating order for `--rounds` rounds and the table shows medians, so a burst of load from elsewhere does not land on one peer only.

Backends: "stub", a no-delay stub (nginx answering from memory: /v1/completions with a JSON
body, /v1/chat/completions with a 17-event SSE body), so what is measured is the proxy
itself; and "replica", two `gpufleet replica` processes with tiny explicit step times.

Sharing 2 cores: with pinning (the default, `taskset`), the proxy under test gets CPU 1 to
itself, and the load generator and the backends share CPU 0; every proxy is measured the
same way (the Rust routers run their thread pools on that one CPU, as the gateway runs its
one event loop). The machine is shared with other work, so the script also reports the
proxy's CPU seconds per request (from /proc: the process and its children), which depends
far less on what else runs than requests/s or latency do.

Peers come from PyPI into venvs outside the repository (benchmarks/peers.py); nginx is
Debian's (`apt-get install -y nginx`), run as a plain reverse proxy with keep-alive
upstream connections and no buffering, from a config this script writes to a temp dir.
Results: benchmarks/results/gateway_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.stats import percentile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from peers import PEER_VERSIONS, rust_router_argv  # noqa: E402
from record import RESULTS, write_result  # noqa: E402

MODEL = "stub-model"
STREAM_EVENTS = 16  # token events per streamed answer (plus one role event and [DONE])


# -- the no-delay backend (nginx answering from memory) ----------------------------------
def _sse_body() -> str:
    events = [
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        }
    ]
    for i in range(STREAM_EVENTS):
        events.append(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": MODEL,
                "choices": [{"index": 0, "delta": {"content": f" w{i}"}}],
            }
        )
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"  # fmt: skip


def _json_body() -> str:
    return json.dumps({"id": "c", "object": "text_completion", "created": 0, "model": MODEL,
                       "choices": [{"index": 0, "text": " w" * STREAM_EVENTS,
                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 8, "completion_tokens": STREAM_EVENTS,
                                 "total_tokens": 8 + STREAM_EVENTS}})  # fmt: skip


def _nginx_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def nginx_stub_conf(ports: list[int], tmp: Path) -> str:
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                      "created": 0, "owned_by": "stub"}]})  # fmt: skip
    info = json.dumps({"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True})
    servers = "".join(
        f"""
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location = /health {{ return 200 ''; }}
        location = /v1/models {{ default_type application/json; return 200 {_nginx_quote(models)}; }}
        location = /get_model_info {{ default_type application/json; return 200 {_nginx_quote(info)}; }}
        location = /get_server_info {{ default_type application/json; return 200 {_nginx_quote(info)}; }}
        location = /metrics {{ default_type text/plain; return 200 'vllm:num_requests_running 0\\n'; }}
        location = /v1/chat/completions {{
            default_type text/event-stream; return 200 {_nginx_quote(_sse_body())};
        }}
        location = /v1/completions {{
            default_type application/json; return 200 {_nginx_quote(_json_body())};
        }}
    }}"""
        for port in ports
    )
    return _nginx_main(tmp, servers)


def nginx_proxy_conf(port: int, upstreams: list[str], tmp: Path) -> str:
    servers = "".join(f"        server {u.removeprefix('http://')};\n" for u in upstreams)
    body = f"""
    upstream backends {{
{servers}        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}"""
    return _nginx_main(tmp, body)


def _nginx_main(tmp: Path, http_body: str) -> str:
    return f"""
worker_processes 1;
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log crit;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    client_max_body_size 16m;
{http_body}
}}
"""


# -- processes ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pinned(argv: list[str], cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu, *argv] if cpu is not None else argv


def start(argv: list[str], cpu: str | None, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(
            _pinned(argv, cpu), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its descendants (threads are counted by the kernel)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        ppid = int(fields[1])
        stats[int(entry)] = (ppid, (int(fields[11]) + int(fields[12])) / tick)
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += stats[p][1]
        todo.extend(children.get(p, []))
    return total


def wait_ready(url: str, stream_path: str, model: str, timeout_s: float = 120.0) -> None:
    """Until a real request through `url` answers 200 (routers discover workers first)."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 4}).encode()
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(url + stream_path, data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready: {last}")


# -- the load generator (run in its own process: `--loadgen`) ------------------------------
async def _loadgen(
    url: str, path: str, concurrency: int, total: int, warmup: int, model: str
) -> dict:
    import aiohttp

    stream = path.endswith("chat/completions")
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": STREAM_EVENTS, "stream": True} if stream else
                      {"model": model, "prompt": "hi", "max_tokens": STREAM_EVENTS}).encode()  # fmt: skip
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    e2e: list[float] = []
    ttft: list[float] = []
    errors = 0
    events = 0  # SSE events received by the recorded requests (streamed ones)
    next_index = 0

    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(limit: int, record: bool) -> None:
            nonlocal next_index, errors, events
            while next_index < limit:
                next_index += 1
                t0 = time.perf_counter()
                first = 0.0
                chunks = []
                async with session.post(url + path, data=body, headers=headers) as resp:
                    async for chunk in resp.content.iter_any():
                        if not first:
                            first = time.perf_counter()
                        chunks.append(chunk)
                    ok = resp.status == 200
                end = time.perf_counter()
                if not record:
                    continue
                if not ok:
                    errors += 1
                if stream:
                    events += b"".join(chunks).count(b"data: ")
                e2e.append(end - t0)
                ttft.append((first or end) - t0)

        await asyncio.gather(*(worker(warmup, False) for _ in range(concurrency)))
        next_index = 0
        t_start = time.perf_counter()
        await asyncio.gather(*(worker(total, True) for _ in range(concurrency)))
        wall_s = time.perf_counter() - t_start
    return {
        "wall_s": wall_s,
        "requests": len(e2e),
        "errors": errors,
        "events": events,
        "e2e_p50_s": _pct(e2e, 0.5),
        "e2e_p99_s": _pct(e2e, 0.99),
        "ttft_p50_s": _pct(ttft, 0.5),
        "ttft_p99_s": _pct(ttft, 0.99),
    }


def _pct(values: list[float], q: float) -> float:
    got = percentile(values, q * 100.0)  # gpufleet.stats: numpy's linear, as every figure
    return float("nan") if got is None else got


def run_load(url: str, path: str, concurrency: int, total: int, cpu: str | None,
             proxy_pid: int | None, model: str) -> dict[str, Any]:  # fmt: skip
    argv = [sys.executable, __file__, "--loadgen", url, path, str(concurrency), str(total),
            str(max(50, total // 10)), model]  # fmt: skip
    cpu_before = cpu_seconds(proxy_pid) if proxy_pid else 0.0
    out = subprocess.run(_pinned(argv, cpu), capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    cpu_after = cpu_seconds(proxy_pid) if proxy_pid else 0.0
    raw = json.loads(out.stdout)
    n = raw["requests"]
    warmup = max(50, total // 10)
    return {
        "requests": n,
        "errors": raw["errors"],
        "rps": n / raw["wall_s"],
        "e2e_p50_ms": 1000 * raw["e2e_p50_s"],
        "e2e_p99_ms": 1000 * raw["e2e_p99_s"],
        "ttft_p50_ms": 1000 * raw["ttft_p50_s"],
        "ttft_p99_ms": 1000 * raw["ttft_p99_s"],
        # CPU over the whole loadgen run, warmup requests included.
        "proxy_cpu_ms_per_request": 1000 * (cpu_after - cpu_before) / (n + warmup)
        if proxy_pid
        else None,
        # Streamed: proxy CPU per SSE event relayed (request costs included, spread over
        # the answer's events); warmup requests count with the events they relayed.
        "proxy_cpu_us_per_event": 1e6
        * (cpu_after - cpu_before)
        / (raw["events"] * (n + warmup) / n)
        if proxy_pid and raw["events"]
        else None,
    }


# -- peers ---------------------------------------------------------------------------------
def peer_argv(name: str, port: int, upstreams: list[str], tmp: Path) -> list[str] | None:
    if name == "gpufleet":
        args = [sys.executable, "-c", "from gpufleet.cli import main; main()", "gateway",
                "--port", str(port), "--policy", "round_robin", "--log-level", "WARNING"]  # fmt: skip
        for u in upstreams:
            args += ["--replica", u]
        return args
    if name in ("sglang-router", "vllm-router"):
        return rust_router_argv(name, port, upstreams)
    if name == "nginx":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            return None
        conf = tmp / "proxy.conf"
        conf.write_text(nginx_proxy_conf(port, upstreams, tmp))
        return [nginx, "-c", str(conf), "-p", str(tmp)]
    raise ValueError(name)


REPLICA_MODEL = "meta-llama/Llama-3.1-8B"


class Backends:
    """Two backends of one kind: "stub" (nginx from memory) or "replica" (gpufleet replica)."""

    def __init__(self, kind: str, tmp: Path, cpu: str | None) -> None:
        self.kind = kind
        self.ports = [free_port(), free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.model = MODEL if kind == "stub" else REPLICA_MODEL
        self.procs: list[subprocess.Popen[bytes]] = []
        if kind == "stub":
            stub_dir = tmp / "stub"
            for d in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
                (stub_dir / d).mkdir(parents=True, exist_ok=True)
            conf = tmp / "stub.conf"
            conf.write_text(nginx_stub_conf(self.ports, stub_dir))
            nginx = shutil.which("nginx") or "/usr/sbin/nginx"
            self.procs.append(start([nginx, "-c", str(conf), "-p", str(stub_dir)], cpu,
                                    tmp / "stub.log"))  # fmt: skip
        else:
            # Tiny explicit step times: the replica's HTTP and engine loop, not a GPU model.
            for port in self.ports:
                argv = [sys.executable, "-c", "from gpufleet.cli import main; main()",
                        "replica", "--model", REPLICA_MODEL, "--port", str(port),
                        "--step-time", "base_s=0.0002"]  # fmt: skip
                self.procs.append(start(argv, cpu, tmp / f"replica-{port}.log"))
        for url in self.urls:
            wait_ready(url, "/v1/completions", self.model)

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)


class Runner:
    """Starts each peer in front of the backends and drives it at each concurrency."""

    def __init__(self, args: argparse.Namespace, tmp: Path, load_cpu: str | None,
                 proxy_cpu: str | None) -> None:  # fmt: skip
        self.args = args
        self.tmp = tmp
        self.load_cpu = load_cpu
        self.proxy_cpu = proxy_cpu
        self.concurrencies = [int(c) for c in args.concurrency.split(",")]
        self.rows: list[dict[str, Any]] = []

    def run_peer(self, peer: str, rnd: int, backends: Backends) -> None:
        proc = None
        try:
            if peer == "direct":
                url, pid = backends.urls[0], None
            else:
                port = free_port()
                ptmp = self.tmp / f"{backends.kind}-{peer}-{rnd}"
                for d in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
                    (ptmp / d).mkdir(parents=True, exist_ok=True)
                argv = peer_argv(peer, port, backends.urls, ptmp)
                if argv is None:
                    print(f"skip {peer}: not installed", file=sys.stderr)
                    return
                proc = start(argv, self.proxy_cpu, ptmp / "log")
                url, pid = f"http://127.0.0.1:{port}", proc.pid
                wait_ready(url, "/v1/completions", backends.model)
            top = max(self.concurrencies)
            requests = self.args.requests if backends.kind == "stub" else self.args.replica_requests
            for c in self.concurrencies:
                n = requests if c == top else max(200, requests // 10)
                for stream in (False, True):
                    path = "/v1/chat/completions" if stream else "/v1/completions"
                    row: dict[str, Any] = {"backend": backends.kind, "peer": peer, "round": rnd,
                                           "concurrency": c, "stream": stream}  # fmt: skip
                    row.update(run_load(url, path, c, n, self.load_cpu, pid, backends.model))
                    self.rows.append(row)
                    print(json.dumps(row), flush=True)
        except Exception as exc:  # one peer failing must not lose the others
            print(f"{peer} on {backends.kind} failed: {exc}", file=sys.stderr)
        finally:
            if proc is not None:
                stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="per run at the top concurrency")
    parser.add_argument("--replica-requests", type=int, default=1000,
                        help="the same, on the replica backends")  # fmt: skip
    parser.add_argument("--backends", default="stub,replica")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--peers", default="direct,gpufleet,sglang-router,vllm-router,nginx")
    parser.add_argument("--rounds", type=int, default=3, help="peers rotate order each round")
    parser.add_argument("--no-pin", action="store_true", help="do not taskset the processes")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    pin = not args.no_pin and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    load_cpu, proxy_cpu = ("0", "1") if pin else (None, None)
    with tempfile.TemporaryDirectory(prefix="gw-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        runner = Runner(args, tmp, load_cpu, proxy_cpu)
        peers = args.peers.split(",")
        for kind in args.backends.split(","):
            backends = Backends(kind, tmp, load_cpu)
            try:
                for rnd in range(args.rounds):
                    shift = rnd % len(peers)
                    for peer in peers[shift:] + peers[:shift]:
                        runner.run_peer(peer, rnd, backends)
            finally:
                backends.stop()
    write_results(runner.rows, args.out, pin, peers)


def median(values: list[float]) -> float:
    return percentile(values, 50.0) or 0.0


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (peer, clients, stream): the median of each figure over the rounds."""
    groups: dict[tuple[str, str, int, bool], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["backend"], r["peer"], r["concurrency"], r["stream"]), []).append(r)
    out = []
    for (backend, peer, c, stream), rs in groups.items():
        row: dict[str, Any] = {"backend": backend, "peer": peer, "concurrency": c,
                               "stream": stream, "rounds": len(rs)}  # fmt: skip
        for key in ("rps", "e2e_p50_ms", "e2e_p99_ms", "ttft_p50_ms", "ttft_p99_ms"):
            row[key] = median([r[key] for r in rs])
        cpus = [r["proxy_cpu_ms_per_request"] for r in rs if r["proxy_cpu_ms_per_request"]]
        row["proxy_cpu_ms_per_request"] = median(cpus) if cpus else None
        per_event = [r["proxy_cpu_us_per_event"] for r in rs if r.get("proxy_cpu_us_per_event")]
        row["proxy_cpu_us_per_event"] = median(per_event) if per_event else None
        row["errors"] = sum(r["errors"] for r in rs)
        out.append(row)
    order = {"direct": 0, "gpufleet": 1, "sglang-router": 2, "vllm-router": 3, "nginx": 4}
    return sorted(
        out, key=lambda r: (r["backend"], order.get(r["peer"], 9), r["concurrency"], r["stream"])
    )


def write_results(
    raw_rows: list[dict[str, Any]], out: Path, pinned: bool, peers: list[str]
) -> None:
    results = summarize(raw_rows)
    direct = {
        (r["backend"], r["concurrency"], r["stream"]): r for r in results if r["peer"] == "direct"
    }
    for r in results:
        d = direct.get((r["backend"], r["concurrency"], r["stream"]))
        r["added_e2e_p50_ms"] = r["e2e_p50_ms"] - d["e2e_p50_ms"] if d else None
        r["added_ttft_p50_ms"] = r["ttft_p50_ms"] - d["ttft_p50_ms"] if d else None
    setup = {"pinned": pinned, "cpus": os.cpu_count(), "stream_events": STREAM_EVENTS}
    data = {"setup": setup, "summary": results, "rounds": raw_rows}
    lines = [
        "| backend | peer | clients | stream | req/s | p50 e2e ms | p99 e2e ms | p50 TTFT ms | "
        "p99 TTFT ms | added p50 TTFT ms | proxy CPU ms/req | proxy CPU µs/event | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cpu = r["proxy_cpu_ms_per_request"]
        added = r["added_ttft_p50_ms"]
        per_event = r["proxy_cpu_us_per_event"]
        lines.append(
            f"| {r['backend']} | {r['peer']} | {r['concurrency']} | {r['stream']} | {r['rps']:.0f} | "
            f"{r['e2e_p50_ms']:.2f} | {r['e2e_p99_ms']:.2f} | {r['ttft_p50_ms']:.2f} | "
            f"{r['ttft_p99_ms']:.2f} | {'' if added is None else f'{added:.3f}'} | "
            f"{'' if cpu is None else f'{cpu:.3f}'} | "
            f"{'' if per_event is None else f'{per_event:.1f}'} | {r['errors']} |"
        )
    write_result(
        out / "gateway_overhead",
        data,
        "\n".join(lines),
        peers=[p for p in peers if p in PEER_VERSIONS],
    )
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--loadgen":
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.install()
        url, path, c, total, warmup, model = sys.argv[2:8]
        result = asyncio.run(_loadgen(url, path, int(c), int(total), int(warmup), model))
        print(json.dumps(result))
    else:
        main()
