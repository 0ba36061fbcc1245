"""Parity: `gpufleet bench`, aiperf and `vllm bench serve` measure the same replica alike.

Starts one `gpufleet replica` (simulated engine with explicit step-time constants and prefix
caching off, so the clients' different prompt texts cost the same), then runs each client
one after the other with the same shape: completions endpoint, streaming, fixed input and
output lengths (in the replica's own token count: every client loads the replica's
tokenizer from a local directory, `Tokenizer().save_hf_directory`, so nothing is
downloaded), the same request count, at

- constant arrival rates (`--rates`): every client offers the same schedule, and
- closed loops (`--concurrency`): N requests in flight, the next sent when one finishes.

Compared per run: mean TTFT, TPOT, ITL and request throughput, each within 5 % of
gpufleet's, or the difference explained by the client's own overhead: every client is also
run against a replica whose steps take no time (`--step-time base_s=0`), and what a client
adds there (its floor, mostly HTTP and SSE parsing) is subtracted before comparing.

Peers come from PyPI into their own venvs (benchmarks/peers.py): aiperf always; vLLM only
with `--with-vllm` (a ~9 GB venv: torch and CUDA wheels) or when that venv already exists.

    .venv/bin/python benchmarks/bench_parity.py [--rates 4,16] [--concurrency 4] [--with-vllm]

Writes JSON and a markdown table, with the exact commands, under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpufleet.tokenizer import Tokenizer
from peers import PEER_VERSIONS, PEERS_DIR, peer_bin, peer_venv
from record import RAW, run_meta, stamp, write_result

AIPERF_VERSION = PEER_VERSIONS["aiperf"]
VLLM_VERSION = PEER_VERSIONS["vllm"]
MODEL = "meta-llama/Llama-3.1-8B"
TOLERANCE = 0.05
METRICS = ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "request_throughput")

Load = tuple[str, float]  # ("rate", requests/s) or ("concurrency", N)
Client = Callable[[str, Load, int, Path], tuple[list[str], dict[str, Any]]]


def start_replica(step_time: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    gpufleet = str(Path(sys.executable).parent / "gpufleet")
    cmd = [gpufleet, "replica", "--model", MODEL, "--port", "0",
           "--no-enable-prefix-caching", "--step-time", step_time]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://[\w.\-]+:\d+", line)
    if match is None:
        proc.kill()
        raise RuntimeError(f"replica did not start: {line!r}")
    return proc, match.group(0), cmd


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{cmd[0]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )


class Clients:
    def __init__(self, isl: int, osl: int, tok_dir: Path):
        self.isl, self.osl, self.tok_dir = isl, osl, tok_dir
        # A tokenizer given by path loads from disk; these keep the hub clients quiet.
        self.env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1",
                        VLLM_NO_USAGE_STATS="1")  # fmt: skip
        # aiperf takes a path for a hub repo id in offline mode; vLLM loads it either way
        self.vllm_env = dict(self.env, HF_HUB_OFFLINE="1")

    def gpufleet(self, url: str, load: Load, n: int, out: Path) -> tuple[list[str], dict[str, Any]]:
        gpufleet = str(Path(sys.executable).parent / "gpufleet")
        kind, value = load
        shape = (["--rate", f"{value:g}", "--burstiness", "inf"] if kind == "rate"
                 else ["--concurrency", f"{value:g}"])  # fmt: skip
        cmd = [gpufleet, "bench", "--url", url, "--model", MODEL, "--endpoint", "completions",
               *shape, "--num-requests", str(n), "--input-tokens", str(self.isl),
               "--output-tokens", str(self.osl), "--quiet", "--no-scrape",
               "--json", str(out)]  # fmt: skip
        _run(cmd)
        m = json.loads(out.read_text())["metrics"]
        return cmd, {k: m[k] for k in (*METRICS, "completed", "failed")}

    def aiperf(self, url: str, load: Load, n: int, out: Path) -> tuple[list[str], dict[str, Any]]:
        aiperf = peer_bin("aiperf", "aiperf")
        kind, value = load
        shape = (["--request-rate", f"{value:g}", "--arrival-pattern", "constant"]
                 if kind == "rate" else ["--concurrency", f"{value:g}"])  # fmt: skip
        cmd = [str(aiperf), "profile", "--model", MODEL, "--url", url,
               "--endpoint-type", "completions", "--streaming", "--tokenizer", str(self.tok_dir),
               "--synthetic-input-tokens-mean", str(self.isl),
               "--synthetic-input-tokens-stddev", "0",
               "--output-tokens-mean", str(self.osl), "--output-tokens-stddev", "0",
               *shape, "--request-count", str(n), "--random-seed", "0",
               "--use-legacy-max-tokens", "--use-server-token-count",
               # one worker and one record processor: fewer processes competing for the CPU
               "--workers-max", "1", "--record-processors", "1",
               "--ui-type", "none", "--output-artifact-dir", str(out)]  # fmt: skip
        _run(cmd, self.env)
        d = json.loads((out / "profile_export_aiperf.json").read_text())
        # aiperf's inter_token_latency is vLLM's TPOT; its inter_chunk_latency is the ITL.
        itl = d.get("inter_chunk_latency") or d["inter_token_latency"]
        return cmd, {
            "mean_ttft_ms": d["time_to_first_token"]["avg"],
            "mean_tpot_ms": d["inter_token_latency"]["avg"],
            "mean_itl_ms": itl["avg"],
            "request_throughput": d["request_throughput"]["avg"],
            "completed": int(d["request_count"]["avg"]),
            "failed": sum(int(e.get("count", 0)) for e in d.get("error_summary") or []),
        }

    def vllm(self, url: str, load: Load, n: int, out: Path) -> tuple[list[str], dict[str, Any]]:
        vllm = PEERS_DIR / "vllm-bench" / "bin" / "vllm"
        kind, value = load
        shape = (["--request-rate", f"{value:g}", "--burstiness", "1e9"] if kind == "rate"
                 else ["--request-rate", "inf", "--max-concurrency", f"{value:g}"])  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        cmd = [str(vllm), "bench", "serve", "--backend", "vllm", "--base-url", url,
               "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", str(self.tok_dir),
               "--dataset-name", "random", "--random-input-len", str(self.isl),
               "--random-output-len", str(self.osl), "--random-range-ratio", "0",
               "--num-prompts", str(n), *shape, "--ignore-eos", "--seed", "0", "--disable-tqdm",
               "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--save-result", "--result-dir", str(out), "--result-filename", "vllm.json"]  # fmt: skip
        _run(cmd, self.vllm_env)
        d = json.loads((out / "vllm.json").read_text())
        return cmd, {k: d[k] for k in (*METRICS, "completed")} | {"failed": d.get("failed", 0)}


def available(with_vllm: bool) -> tuple[list[str], dict[str, str]]:
    names = ["gpufleet", "aiperf"]
    skipped = {}
    vllm = PEERS_DIR / "vllm-bench" / "bin" / "vllm"
    if with_vllm and not vllm.exists():
        peer_venv("vllm-bench", [f"vllm=={VLLM_VERSION}"])
    if vllm.exists():
        names.append("vllm")
    else:
        skipped["vllm"] = (
            f"not installed: vllm=={VLLM_VERSION} is a ~9 GB venv (torch with CUDA wheels from "
            "PyPI); pass --with-vllm to install it into " + str(PEERS_DIR / "vllm-bench")
        )
    return names, skipped


def verdict(base: dict[str, Any], peer: dict[str, Any], floor_b: dict[str, Any] | None,
            floor_p: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """Per metric: the relative difference, and whether it is within 5 % or explained."""
    out: dict[str, Any] = {}
    for k in METRICS:
        a, b = base[k], peer[k]
        rel = abs(b - a) / max(abs(a), 1e-12)
        explained = False
        if floor_b is not None and floor_p is not None and k != "request_throughput":
            # The peer's own overhead (what it adds over gpufleet against a zero-time replica)
            # accounts for the difference: same direction, and no larger (± 5 %).
            own = floor_p[k] - floor_b[k]
            diff = b - a
            explained = diff * own > 0 and abs(diff) <= abs(own) + TOLERANCE * abs(a)
        out[k] = {"rel_diff": rel, "within": rel <= TOLERANCE, "explained_by_floor": explained}
    out["ok"] = all(v["within"] or v["explained_by_floor"] for v in out.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--rates", default="4,16", help="constant arrival rates (requests/s)")
    ap.add_argument("--concurrency", default="4", help="closed-loop concurrencies")
    ap.add_argument("--seconds", type=float, default=10.0, help="sending time per rate run")
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=24)
    ap.add_argument("--step-time", default="base_s=0.02,per_token_s=1e-4")
    ap.add_argument("--with-vllm", action="store_true", help="install vllm (~9 GB) if absent")
    ap.add_argument("--from-json", type=Path, help="recompute verdicts and the table only")
    args = ap.parse_args()
    if args.from_json:
        rerender(args.from_json)
        return
    RAW.mkdir(parents=True, exist_ok=True)
    tok_dir = RAW / "parity_tokenizer"
    Tokenizer().save_hf_directory(str(tok_dir))
    clients = Clients(args.input_tokens, args.output_tokens, tok_dir)
    names, skipped = available(args.with_vllm)
    run_client: dict[str, Client] = {n: getattr(clients, n) for n in names}
    loads: list[Load] = [("rate", float(x)) for x in args.rates.split(",") if x]
    loads += [("concurrency", float(x)) for x in args.concurrency.split(",") if x]

    floors: dict[str, dict[str, Any]] = {}
    replica, url, _ = start_replica("base_s=0,per_token_s=0")
    try:  # each client's own overhead: a replica whose steps take no time, one at a time
        for name in names:
            _, floors[name] = run_client[name](url, ("concurrency", 1.0), 20,
                                               RAW / f"parity_floor_{name}")  # fmt: skip
    finally:
        stop(replica)

    replica, url, replica_cmd = start_replica(args.step_time)
    rows: list[dict[str, Any]] = []
    try:
        for load in loads:
            kind, value = load
            n = max(8, round(value * args.seconds)) if kind == "rate" else max(16, int(value) * 6)
            row: dict[str, Any] = {"load": f"{kind} {value:g}", "requests": n, "clients": {},
                                   "commands": {}}  # fmt: skip
            for name in names:
                cmd, m = run_client[name](url, load, n, RAW / f"parity_{name}_{kind}{value:g}")
                row["clients"][name], row["commands"][name] = m, shlex.join(cmd)
            base = row["clients"]["gpufleet"]
            row["verdicts"] = {
                name: verdict(base, row["clients"][name], floors.get("gpufleet"), floors.get(name))
                for name in names if name != "gpufleet"
            }  # fmt: skip
            row["all_served"] = all(c["completed"] == n and not c["failed"]
                                    for c in row["clients"].values())  # fmt: skip
            rows.append(row)
            print(row["load"], {k: round(v["mean_ttft_ms"], 2) for k, v in row["clients"].items()},
                  flush=True)  # fmt: skip
    finally:
        stop(replica)

    ok = all(r["all_served"] and all(v["ok"] for v in r["verdicts"].values()) for r in rows)
    result = {
        "replica_command": shlex.join(replica_cmd),
        "skipped": skipped,
        "tolerance": TOLERANCE,
        "floors": floors,
        "rows": rows,
        "all_ok": ok,
    }
    table = render(result, names)
    write_result("parity", result, table, peers=[n for n in names if n != "gpufleet"])
    print(table)
    print("PARITY OK" if ok else "PARITY NOT MET")


def rerender(path: Path) -> None:
    """Recompute the verdicts of an earlier run (its meta kept) and rewrite both files."""
    result = json.loads(path.read_text())
    names = list(result["rows"][0]["clients"])
    meta = result.pop("meta", None)
    if meta is None:  # a result written before benchmarks/record.py: keep when and where
        meta = run_meta([n for n in names if n != "gpufleet"])
        when = result.pop("when_unix_s", None)
        if when is not None:
            meta["date"] = datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat(
                timespec="seconds"
            )
        meta["commit"] = result.pop("commit", meta["commit"])
        machine = result.pop("machine", {})
        if machine.get("loadavg"):
            meta["machine"]["load_1min_at_start"] = machine["loadavg"][0]
        meta["command"] = "bench_parity.py --seconds 8"
        for key in ("versions",):
            result.pop(key, None)
    floors = result["floors"]
    for r in result["rows"]:
        base = r["clients"]["gpufleet"]
        r["verdicts"] = {n: verdict(base, c, floors.get("gpufleet"), floors.get(n))
                         for n, c in r["clients"].items() if n != "gpufleet"}  # fmt: skip
    result["all_ok"] = all(
        r["all_served"] and all(v["ok"] for v in r["verdicts"].values()) for r in result["rows"]
    )
    table = render(result, names)
    path.write_text(json.dumps({"meta": meta, **result}, indent=2, default=str) + "\n")
    path.with_suffix(".md").write_text(stamp(meta) + "\n\n" + table)
    print(table)


def render(result: dict[str, Any], names: list[str]) -> str:
    lines = [f"replica: `{result['replica_command']}`", ""]
    for name, why in result["skipped"].items():
        lines.append(f"- {name} skipped: {why}")
    head = "| load | metric | " + " | ".join(names) + " | verdict |"
    lines += ["", head, "|" + "---|" * (len(names) + 3)]
    for r in result["rows"]:
        for k in METRICS:
            cells = " | ".join(f"{r['clients'][n][k]:.2f}" for n in names)
            marks = []
            for n, v in r["verdicts"].items():
                m = v[k]
                mark = "ok" if m["within"] else ("explained" if m["explained_by_floor"] else "NO")
                marks.append(f"{n} {m['rel_diff']:.1%} {mark}")
            lines.append(f"| {r['load']} | {k} | {cells} | {'; '.join(marks)} |")
    floors = result["floors"]
    lines += ["", "client floors (zero-time replica, concurrency 1): "
              + "; ".join(f"{n} TTFT {f['mean_ttft_ms']:.2f} ms, ITL {f['mean_itl_ms']:.2f} ms"
                          for n, f in floors.items()), ""]  # fmt: skip
    for r in result["rows"]:
        for n, c in r["commands"].items():
            lines.append(f"- {r['load']} {n}: `{c}`")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
