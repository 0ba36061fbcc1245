"""How fast `gpufleet plan` answers (issue 2: "under 1 s with the whole search").

    python benchmarks/plan_speed.py [--json FILE] [--repeat N]

Two measurements, side by side in one run:
* the whole command as a user runs it (`gpufleet plan …` in a fresh process: interpreter
  start, imports, search, rendering), for the README's sample and a few hard cases;
* the search alone (`gpufleet.plan.search.plan`) for every catalog model on every catalog
  GPU, in this process.

No peer tool computes this plan, so there is no peer column. Writes JSON (default
benchmarks/results/plan_speed.json) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet.errors import UserError
from gpufleet.plan.search import PlanRequest, plan
from gpufleet.specs import gpu_names, load_gpu, load_model, model_names

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, write_result

CASES: dict[str, list[str]] = {
    "sample 70B h100-sxm": ["--model", "meta-llama/Llama-3.1-70B", "--gpu", "h100-sxm",
                            "--gpus-per-node", "8", "--input-tokens", "1024",
                            "--output-tokens", "256", "--rps", "20", "--ttft-slo", "1.0",
                            "--tpot-slo", "0.05"],
    "405B bf16 (PP) h100-sxm": ["--model", "llama-3.1-405b", "--gpu", "h100-sxm",
                                "--quant", "bf16", "--rps", "2"],
    "DeepSeek-V3 h200 (MoE, EP)": ["--model", "deepseek-ai/DeepSeek-V3", "--gpu", "h200",
                                   "--rps", "10"],
    "8B h100-sxm --json": ["--model", "llama-3.1-8b", "--gpu", "h100", "--rps", "500",
                           "--json"],
    "DeepSeek-V3 h200 rps 20 (DP×EP over nodes, disagg)": [
        "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "h200", "--rps", "20"],
    "Kimi-K2 gb200 (NVL72 DP×EP, disagg)": ["--model", "moonshotai/Kimi-K2-Instruct",
                                            "--gpu", "gb200", "--rps", "20"],
    "70B NVFP4 b200": ["--model", "RedHatAI/Llama-3.1-70B-Instruct-NVFP4", "--gpu", "b200",
                       "--rps", "10"],
    "gpt-oss-120b h100 sglang": ["--model", "openai/gpt-oss-120b", "--gpu", "h100",
                                 "--engine", "sglang", "--rps", "10"],
}  # fmt: skip


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(args: list[str], repeat: int) -> dict[str, float]:
    """Wall time as the user waits, and the process's CPU time, which other jobs on a
    shared machine do not inflate."""
    runs, cpu = [], []
    for _ in range(repeat):
        start, cpu_start = time.perf_counter(), _children_cpu_s()
        subprocess.run(
            [sys.executable, "-c", "from gpufleet.cli import main; main()", "plan", *args],
            capture_output=True,
            check=True,
            timeout=60,
        )
        runs.append(time.perf_counter() - start)
        cpu.append(_children_cpu_s() - cpu_start)
    return {
        "median_s": statistics.median(runs),
        "max_s": max(runs),
        "cpu_median_s": statistics.median(cpu),
        "cpu_max_s": max(cpu),
    }


def time_searches() -> dict[str, Any]:
    times = []
    errors = 0
    slowest = ("", 0.0)
    for m in model_names():
        model = load_model(m)
        for g in gpu_names():
            start = time.perf_counter()
            try:
                plan(PlanRequest(model=model, gpu=load_gpu(g), rps=10))
            except UserError:
                errors += 1
            took = time.perf_counter() - start
            times.append(took)
            if took > slowest[1]:
                slowest = (f"{m} on {g}", took)
    times.sort()
    return {
        "slowest": slowest[0],
        "plans": len(times),
        "user_errors": errors,
        "median_s": statistics.median(times),
        "p90_s": times[int(0.9 * (len(times) - 1))],
        "max_s": times[-1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", "--json", type=Path, default=RESULTS / "plan_speed", help="path without suffix"
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    commands = {name: time_command(case, args.repeat) for name, case in CASES.items()}
    searches = time_searches()
    result = {"commands": commands, "search_all_models_x_gpus": searches}
    lines = [
        "| what | median s | max s | CPU median s | CPU max s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, t in commands.items():
        lines.append(
            f"| `gpufleet plan` {name} (whole process) | {t['median_s']:.3f} | {t['max_s']:.3f} "
            f"| {t['cpu_median_s']:.3f} | {t['cpu_max_s']:.3f} |"
        )
    lines.append(
        f"| search only, {searches['plans']} model × GPU pairs | {searches['median_s']:.3f} "
        f"| {searches['max_s']:.3f} ({searches['slowest']}) | | |"
    )
    json_path, _ = write_result(args.out, result, "\n".join(lines))
    print("\n".join(lines))
    print(f"\nJSON: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
