"""The simulator compiled with mypyc against its sources, back to back (docs/sim.md).

    make sim-compiled
    python benchmarks/sim_speed_compiled.py [--cases mooncake,azure10x] [--scale 0.5]
                                            [--rounds 2] [--out NAME]

Runs `benchmarks/sim_speed.py`'s cases (one core each, CPU seconds of `run()`) compiled
and then `--interpreted` (gpufleet imported from its sources, the .so files in place),
alternating, `--rounds` times, and checks each pair predicts the same (events, hit rate,
TTFT). Writes benchmarks/results/sim_speed_mypyc.{json,md} (`--out` elsewhere).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import gpufleet.sim.simulator
from gpufleet.native import is_compiled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import write_result
from sim_speed import TARGETS, python_loop_ns, spawn

SAME = ("requests", "events", "prefix_hit_rate", "ttft_p50_ms", "tpot_p50_ms", "preemptions")


def table(pairs: list[dict[str, Any]]) -> str:
    out = ["| case | requests | round | compiled CPU s | interpreted CPU s | speedup | "
           "target (full scale) | same predictions |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for p in pairs:
        c, i = p["compiled"], p["interpreted"]
        target = TARGETS.get(p["case"])
        out.append(
            f"| {p['case']} | {c['requests']:,} | {p['round']} | {c['cpu_s']:.2f} | "
            f"{i['cpu_s']:.2f} | {i['cpu_s'] / c['cpu_s']:.2f}× | "
            f"{f'≤ {target:g}' if target else ''} | {'yes' if p['same'] else 'NO'} |"
        )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="mooncake,azure10x")
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="sim_speed_mypyc", help="path without suffix")
    args = parser.parse_args()
    if not is_compiled(gpufleet.sim.simulator):
        parser.error("the simulator is not compiled: run `make sim-compiled` first")
    pairs = []
    for k in range(1, args.rounds + 1):
        for case in args.cases.split(","):
            rows = {mode: spawn("jump", case, args.scale, mode == "interpreted")
                    for mode in ("compiled", "interpreted")}  # fmt: skip
            if any("error" in r for r in rows.values()):
                print(f"{case}: {rows}", file=sys.stderr)
                return 1
            same = all(rows["compiled"][f] == rows["interpreted"][f] for f in SAME)
            pairs.append({"case": case, "round": k, "same": same, **rows})
            print(f"{case} #{k}: {rows['compiled']['cpu_s']:.2f} compiled, "
                  f"{rows['interpreted']['cpu_s']:.2f} interpreted CPU s", file=sys.stderr)  # fmt: skip
    loop_ns = python_loop_ns()
    md = table(pairs) + (
        f"\n\nOne core per case, `--scale {args.scale}` of issue 12's cases; compiled and "
        f"interpreted alternate. A plain Python loop iteration took {loop_ns:.0f} ns of CPU here."
    )
    setup = {"scale": args.scale, "rounds": args.rounds, "python_loop_ns": loop_ns}
    json_path, _ = write_result(args.out, {"setup": setup, "pairs": pairs}, md)
    print(md)
    print(f"\nJSON: {json_path}")
    return 0 if all(p["same"] for p in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
