"""Parity: `gpufleet bench` and aiperf measure the same replica the same way.

Starts one `gpufleet replica` (simulated engine with explicit step-time constants and
prefix caching off, so both clients' different prompt texts cost the same), then at each
load runs `gpufleet bench` and aiperf (from PyPI, in its own venv via benchmarks/peers.py)
one after the other with the same shape: completions endpoint, streaming, fixed input and
output lengths, the same constant arrival rate, the same request count. Constant-rate
arrivals make both clients offer the replica the same schedule (a closed loop would not:
how soon each client sends the next request after one finishes shifts it against the
engine's step cycle, which changes what is measured, not how). aiperf counts tokens
with a tokenizer built locally (`Tokenizer().save_hf_directory`: the same whitespace-word
counts as the replica), loaded from a path, so nothing is downloaded.

Reports mean TTFT and mean TPOT (aiperf's "inter token latency" is (latency − TTFT) /
(output tokens − 1), vLLM's TPOT) from both, and whether they agree within 5%. Writes JSON
and a markdown table, with the exact commands, under benchmarks/results/.

    .venv/bin/python benchmarks/bench_parity.py [--rates 4,16] [--seconds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpufleet.tokenizer import Tokenizer
from peers import PEER_VERSIONS, peer_bin
from record import RAW, write_result

AIPERF_VERSION = PEER_VERSIONS["aiperf"]
MODEL = "meta-llama/Llama-3.1-8B"
TOLERANCE = 0.05


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


def run_gpufleet(
    url: str, rate: float, n: int, isl: int, osl: int, out: Path
) -> tuple[list[str], dict[str, Any]]:
    gpufleet = str(Path(sys.executable).parent / "gpufleet")
    cmd = [gpufleet, "bench", "--url", url, "--model", MODEL, "--endpoint", "completions",
           "--rate", f"{rate:g}", "--burstiness", "inf", "--num-requests", str(n),
           "--input-tokens", str(isl),
           "--output-tokens", str(osl), "--quiet", "--json", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    m = json.loads(out.read_text())["metrics"]
    return cmd, {
        "completed": m["completed"],
        "failed": m["failed"],
        "mean_ttft_ms": m["mean_ttft_ms"],
        "mean_tpot_ms": m["mean_tpot_ms"],
        "mean_e2el_ms": m["mean_e2el_ms"],
        "request_throughput": m["request_throughput"],
    }


def run_aiperf(
    aiperf: Path, url: str, tok_dir: Path, rate: float, n: int, isl: int, osl: int, art: Path
) -> tuple[list[str], dict[str, Any]]:
    cmd = [str(aiperf), "profile", "--model", MODEL, "--url", url,
           "--endpoint-type", "completions", "--streaming", "--tokenizer", str(tok_dir),
           "--synthetic-input-tokens-mean", str(isl), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(osl), "--output-tokens-stddev", "0",
           "--request-rate", f"{rate:g}", "--arrival-pattern", "constant",
           "--request-count", str(n), "--random-seed", "0",
           "--use-legacy-max-tokens", "--use-server-token-count",
           # one worker and one record processor: fewer processes competing for the CPU
           "--workers-max", "1", "--record-processors", "1",
           "--ui-type", "none", "--output-artifact-dir", str(art)]  # fmt: skip
    # A tokenizer given by path loads from disk; these keep the hub client quiet.
    env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"aiperf failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    d = json.loads((art / "profile_export_aiperf.json").read_text())
    return cmd, {
        "completed": int(d["request_count"]["avg"]),
        "failed": sum(int(e.get("count", 0)) for e in d.get("error_summary") or []),
        "mean_ttft_ms": d["time_to_first_token"]["avg"],
        "mean_tpot_ms": d["inter_token_latency"]["avg"],
        "mean_e2el_ms": d["request_latency"]["avg"],
        "request_throughput": d["request_throughput"]["avg"],
    }


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rates", default="4,16", help="constant arrival rates (requests/s)")
    ap.add_argument("--seconds", type=float, default=10.0, help="sending time per run")
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=24)
    ap.add_argument("--step-time", default="base_s=0.02,per_token_s=1e-4")
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    RAW.mkdir(parents=True, exist_ok=True)
    tok_dir = RAW / "parity_tokenizer"
    Tokenizer().save_hf_directory(str(tok_dir))
    aiperf = peer_bin("aiperf", "aiperf")

    replica, url, replica_cmd = start_replica(args.step_time)
    rows: list[dict[str, Any]] = []
    try:
        for rate in rates:
            n = max(8, round(rate * args.seconds))
            gcmd, g = run_gpufleet(url, rate, n, args.input_tokens, args.output_tokens,
                                   RAW / f"parity_gpufleet_r{rate:g}.json")  # fmt: skip
            acmd, a = run_aiperf(aiperf, url, tok_dir, rate, n, args.input_tokens,
                                 args.output_tokens, RAW / f"parity_aiperf_r{rate:g}")  # fmt: skip
            row = {
                "rate": rate,
                "requests": n,
                "gpufleet": g,
                "aiperf": a,
                "ttft_rel_diff": rel_diff(g["mean_ttft_ms"], a["mean_ttft_ms"]),
                "tpot_rel_diff": rel_diff(g["mean_tpot_ms"], a["mean_tpot_ms"]),
                "commands": {"gpufleet": shlex.join(gcmd), "aiperf": shlex.join(acmd)},
            }
            all_served = all(x["completed"] == n and x["failed"] == 0 for x in (g, a))
            row["within_tolerance"] = all_served and (
                max(row["ttft_rel_diff"], row["tpot_rel_diff"]) <= TOLERANCE
            )
            rows.append(row)
            print(f"rate {rate:g}/s: TTFT {g['mean_ttft_ms']:.2f} vs {a['mean_ttft_ms']:.2f} ms, "
                  f"TPOT {g['mean_tpot_ms']:.2f} vs {a['mean_tpot_ms']:.2f} ms", flush=True)  # fmt: skip
    finally:
        replica.terminate()
        try:
            replica.wait(timeout=10)
        except subprocess.TimeoutExpired:
            replica.kill()
            replica.wait()

    result = {
        "replica_command": shlex.join(replica_cmd),
        "aiperf_version": AIPERF_VERSION,
        "tolerance": TOLERANCE,
        "rows": rows,
        "all_within_tolerance": all(r["within_tolerance"] for r in rows),
    }
    lines = [
        f"replica: `{result['replica_command']}`",
        "",
        "| rate (req/s) | requests | mean TTFT gpufleet (ms) | mean TTFT aiperf (ms) | Δ "
        "| mean TPOT gpufleet (ms) | mean TPOT aiperf (ms) | Δ | within 5% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g, a = r["gpufleet"], r["aiperf"]
        lines.append(
            f"| {r['rate']:g} | {g['completed']} / {a['completed']} | {g['mean_ttft_ms']:.2f} "
            f"| {a['mean_ttft_ms']:.2f} | {r['ttft_rel_diff']:.1%} | {g['mean_tpot_ms']:.2f} "
            f"| {a['mean_tpot_ms']:.2f} | {r['tpot_rel_diff']:.1%} | {'yes' if r['within_tolerance'] else 'NO'} |"
        )
    lines.append("")
    for r in rows:
        lines.append(f"- rate {r['rate']:g} gpufleet: `{r['commands']['gpufleet']}`")
        lines.append(f"- rate {r['rate']:g} aiperf: `{r['commands']['aiperf']}`")
    table = "\n".join(lines) + "\n"
    write_result("parity", result, table, peers=["aiperf"])
    print(table)
    print("PARITY OK" if result["all_within_tolerance"] else "PARITY NOT MET")


if __name__ == "__main__":
    main()
