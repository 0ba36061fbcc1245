"""`gpufleet plan` swept as a demanding user would run it (issue 14: "plans hold on models
it was never fitted to").

    GPUFLEET_SHARED=/work/shared python benchmarks/plan_sweep.py [--quick] [--stem NAME]

Every config of tests/plan/data/unseen_configs, tests/plan/data/modelopt,
benchmarks/data/model_configs and $GPUFLEET_SHARED/model_configs (when present) × every
catalog GPU × vllm / sglang / trtllm, then each option a user would try (--quant, --kv-dtype,
--gpu-memory-utilization, --max-model-len, long prompts, --rps, tight SLOs, --max-gpus,
--gpus-per-node, --disagg off, --emit k8s) on one GPU and engine per config (rotating), then
malformed inputs. Each run goes through the CLI's own entry (`gpufleet.cli.main`, in this
process, --json -); a handful also run as real subprocesses. Checks invariants, not constants
(`check_plan`, `check_error`); writes JSON + markdown through `record.write_result`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_sweep_checks import (
    CONFIG_DIRS,
    ROOT,
    Outcome,
    check_commands,
    check_error,
    check_malformed,
    check_plan,
    check_text,
    malformed_cases,
    malformed_dir,
    physics,
)

__all__ = ["CONFIG_DIRS", "ROOT", "Outcome", "check_commands", "check_error", "check_malformed",
           "check_plan", "check_text", "malformed_cases", "malformed_dir", "physics"]  # fmt: skip
ENGINES = ("vllm", "sglang", "trtllm")
PLAN_TIME_LIMIT_S = 1.0
# Options a user would try, each on its own (the --max-model-len ones past the model's
# limit are built per config in `option_sets`).
OPTIONS: dict[str, list[str]] = {
    "quant nvfp4": ["--quant", "nvfp4"],
    "quant mxfp4": ["--quant", "mxfp4"],
    "quant fp8": ["--quant", "fp8"],
    "quant int4": ["--quant", "int4"],
    "quant bf16": ["--quant", "bf16"],
    "kv fp8": ["--kv-dtype", "fp8"],
    "gmu 0.95": ["--gpu-memory-utilization", "0.95"],
    "gmu 0.5": ["--gpu-memory-utilization", "0.5"],
    "mml 1": ["--max-model-len", "1"],
    "mml 131072": ["--max-model-len", "131072"],
    "long prompt": ["--input-tokens", "32000", "--output-tokens", "10"],
    "rps 0.01": ["--rps", "0.01"],
    "rps 1000": ["--rps", "1000"],
    "tight slo": ["--ttft-slo", "0.05", "--tpot-slo", "0.005"],
    "max-gpus 1": ["--max-gpus", "1"],
    "gpus-per-node 4": ["--gpus-per-node", "4"],
    "disagg off": ["--disagg", "off"],
    "output 1": ["--output-tokens", "1"],
    "gpus-per-node 3": ["--gpus-per-node", "3"],
    "max-gpus 3": ["--max-gpus", "3"],
    "quant int8": ["--quant", "int8"],
    "gmu 0.01": ["--gpu-memory-utilization", "0.01"],
    "rps 1e9": ["--rps", "1e9"],
}


def config_paths(shared: str | None) -> list[Path]:
    """Every model config the sweep plans: a config.json file, or a directory holding one."""
    dirs = list(CONFIG_DIRS)
    if shared:
        dirs.append(Path(shared) / "model_configs")
    out: list[Path] = []
    for d in dirs:
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            is_config = p.suffix == ".json" and p.name != "SOURCES.json"
            if is_config or (p.is_dir() and (p / "config.json").exists()):
                out.append(p)
    return out


def run_cli(args: list[str]) -> Outcome:
    """`gpufleet plan ARGS` through the CLI's own entry, in this process: exit code,
    stdout, stderr; an exception escaping `main` is a traceback the user would see."""
    from gpufleet.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, code = sys.argv, 0
    sys.argv = ["gpufleet", "plan", *args]
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # what a user would see as a traceback
        code = 99
        err.write(f"Traceback (most recent call last):\n  {type(e).__name__}: {e}\n")
    finally:
        sys.argv = argv
    wall = time.perf_counter() - start
    o = Outcome(args, code, out.getvalue(), err.getvalue(), wall)
    o.cpu_seconds = time.process_time() - cpu_start
    return o


def run_subprocess(args: list[str]) -> Outcome:
    """`gpufleet plan ARGS` as a real process (the console entry's own code)."""
    start = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", "from gpufleet.cli import main; main()", "plan", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return Outcome(args, r.returncode, r.stdout, r.stderr, time.perf_counter() - start)


def plan_case(args: list[str], model_arg: str, input_tokens: int = 1024) -> Outcome:
    """One plan through the CLI with --json -, checked (plan or clean refusal)."""
    o = run_cli([*args, "--json", "-"])
    if o.code == 0:
        try:
            d = json.loads(o.stdout)
        except json.JSONDecodeError as e:
            o.problems.append(f"exit 0 without a JSON plan: {e}")
            return o
        d["_physics"] = physics(model_arg, input_tokens)
        o.plan = d
        o.problems += check_plan(d)
    else:
        o.problems += check_error(o)
    if o.cpu_seconds > PLAN_TIME_LIMIT_S:
        o.problems.append(f"took {o.cpu_seconds:.2f} s CPU > {PLAN_TIME_LIMIT_S} s")
    return o


def monotonic(model_arg: str, gpu_name: str, engine: str) -> list[str]:
    """More --rps never fewer GPUs (through the CLI); fp8 weights never more GiB than
    bf16, and more GPUs per replica never more weight GiB per GPU (on the layouts the
    search tries: TP 1, 2, 4, 8)."""
    from gpufleet.plan.layout import Layout
    from gpufleet.plan.weights import weight_bytes_per_gpu
    from gpufleet.specs import load_gpu, load_model

    problems = []
    base = ["--model", model_arg, "--gpu", gpu_name, "--engine", engine, "--disagg", "off"]
    prev: tuple[float, int] | None = None
    for rps in ("0.5", "5", "50", "500"):
        o = run_cli([*base, "--rps", rps, "--json", "-"])
        if o.code != 0:
            break
        gpus = int(json.loads(o.stdout)["chosen"]["total_gpus"] or 0)
        if prev is not None and gpus < prev[1]:
            problems.append(f"--rps {rps} plans {gpus} GPUs < {prev[1]} at --rps {prev[0]}")
        prev = (float(rps), gpus)
    model, gpu = load_model(model_arg), load_gpu(gpu_name)
    for tp in (1, 2, 4, 8):
        w = {q: weight_bytes_per_gpu(model, Layout(tp=tp, weight_dtype=q), gpu)
             for q in ("bf16", "fp8")}  # fmt: skip
        if w["fp8"] > w["bf16"] * 1.0001:
            problems.append(f"TP={tp}: fp8 weights {w['fp8']:.4g} B > bf16 {w['bf16']:.4g} B")
    for q in ("bf16", "fp8", model.checkpoint_dtype):
        per_gpu = [weight_bytes_per_gpu(model, Layout(tp=tp, weight_dtype=q), gpu)
                   for tp in (1, 2, 4, 8)]  # fmt: skip
        for a, b in itertools.pairwise(per_gpu):
            if b > a * 1.0001:
                problems.append(f"{q}: more TP ranks hold more weights per GPU ({per_gpu})")
                break
    return problems


def option_sets(model_arg: str) -> dict[str, list[str]]:
    """OPTIONS plus --max-model-len one past the model's limit."""
    from gpufleet.errors import UserError
    from gpufleet.specs import load_model

    try:
        limit = load_model(model_arg).max_position_embeddings
    except UserError:  # a model the planner refuses: every option must refuse it cleanly
        return dict(OPTIONS)
    return {**OPTIONS, "mml past limit": ["--max-model-len", str(limit + 1)]}


def sweep(shared: str | None, quick: bool = False) -> dict[str, Any]:
    """The whole sweep; `quick`: repo configs only, two GPUs, one engine per config."""
    from gpufleet.specs import gpu_names

    gpus = ["h100-sxm", "l4"] if quick else gpu_names()
    configs = config_paths(None if quick else shared)
    cases: list[dict[str, Any]] = []

    def record(kind: str, o: Outcome) -> None:
        cases.append({"kind": kind, "args": o.args, "code": o.code, "seconds": o.seconds,
                      "cpu_seconds": o.cpu_seconds,
                      "problems": o.problems,
                      "error": o.stderr.strip().splitlines()[-1] if o.code and o.stderr.strip() else ""})  # fmt: skip

    for i, path in enumerate(configs):
        engines = [ENGINES[i % 3]] if quick else list(ENGINES)
        for gpu in gpus:
            for engine in engines:
                args = ["--model", str(path), "--gpu", gpu, "--engine", engine]
                record("grid", plan_case(args, str(path)))
        gpu, engine = gpus[i % len(gpus)], ENGINES[i % 3]
        for name, extra in option_sets(str(path)).items():
            args = ["--model", str(path), "--gpu", gpu, "--engine", engine, *extra]
            tokens = (
                int(extra[extra.index("--input-tokens") + 1]) if "--input-tokens" in extra else 1024
            )
            record(f"option {name}", plan_case(args, str(path), tokens))
        with tempfile.TemporaryDirectory(prefix="plan_sweep_k8s_") as tmp:
            o = run_cli(["--model", str(path), "--gpu", gpu, "--emit", "k8s", tmp])
            if o.code == 0 and not any(Path(tmp).iterdir()):
                o.problems.append("--emit k8s wrote no files")
            elif o.code != 0:
                o.problems += check_error(o)
                if grid_planned(cases, str(path), gpu):
                    o.problems.append("the plan succeeds, its --emit k8s fails")
            record("option emit k8s", o)
        o = run_cli(["--model", str(path), "--gpu", gpu, "--engine", engine])  # rendered tables
        o.problems += check_error(o) if o.code else check_text(o.stdout)
        record("text output", o)
        mono = Outcome(["monotonic", str(path), gpu, engine], 0, "", "", 0.0)
        if grid_planned(cases, str(path)):
            mono.problems = monotonic(str(path), gpu, engine)
            record("monotonic", mono)
    with malformed_dir() as tmp:
        for name, (args, field_name) in malformed_cases(tmp).items():
            o = run_cli(args)
            o.problems += check_malformed(o, field_name)
            record(f"malformed {name}", o)
    for path in configs[:: max(1, len(configs) // 4)][:4]:
        o = run_subprocess(["--model", str(path), "--gpu", "h100-sxm", "--json", "-"])
        o.problems += [] if o.code == 0 else check_error(o)
        record("subprocess", o)
    return {"configs": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
                        for p in configs], "gpus": gpus, "cases": cases}  # fmt: skip


def grid_planned(cases: list[dict[str, Any]], model_arg: str, gpu: str | None = None) -> bool:
    """Whether the grid planned `model_arg` (on `gpu`) at least once (refused models skip
    the monotonic checks, which load the model directly)."""
    return any(c["kind"] == "grid" and c["code"] == 0 and c["args"][1] == model_arg
               and gpu in (None, c["args"][3]) for c in cases)  # fmt: skip


def summarize(result: dict[str, Any]) -> str:
    """Markdown: cases, plans, refusals and problems by kind; every problem listed."""
    kinds: dict[str, dict[str, int]] = {}
    for c in result["cases"]:
        k = c["kind"].split(" ")[0] if c["kind"].startswith("malformed") else c["kind"]
        row = kinds.setdefault(k, {"cases": 0, "plans": 0, "refused": 0, "problems": 0})
        row["cases"] += 1
        row["plans" if c["code"] == 0 else "refused"] += 1
        row["problems"] += bool(c["problems"])
    timed = [c for c in result["cases"] if c["kind"] not in ("monotonic", "subprocess")]
    wall = sorted(c["seconds"] for c in timed)
    cpu = sorted(c["cpu_seconds"] for c in timed)
    lines = [f"{len(result['configs'])} configs × {len(result['gpus'])} GPUs × engines; "
             f"plan time in process (CLI entry, --json): CPU median {cpu[len(cpu) // 2]:.3f} s, "
             f"max {cpu[-1]:.3f} s; wall median {wall[len(wall) // 2]:.3f} s, max {wall[-1]:.3f} s "
             "(wall shares the machine; the 1 s check is on CPU)", "",
             "| kind | cases | plans | clean refusals | with problems |", "|---|---|---|---|---|"]  # fmt: skip
    for k, r in kinds.items():
        lines.append(f"| {k} | {r['cases']} | {r['plans']} | {r['refused']} | {r['problems']} |")
    sub = [c["seconds"] for c in result["cases"] if c["kind"] == "subprocess"]
    if sub:
        lines += ["", f"Real processes (`gpufleet plan … --json -`, interpreter start and "
                  f"imports included): wall {min(sub):.2f}–{max(sub):.2f} s over {len(sub)} runs"]  # fmt: skip
    bad = [c for c in result["cases"] if c["problems"]]
    lines += ["", f"Cases with problems: {len(bad)}"]
    for c in bad[:200]:
        lines.append(f"- `{' '.join(c['args'])}`: {'; '.join(c['problems'])[:400]}")
    return "\n".join(lines)


def slim(result: dict[str, Any]) -> dict[str, Any]:
    """What the committed JSON keeps: configs, GPUs, counts by kind, plan-time figures and
    every case with a problem (every case's record goes to benchmarks/results/raw/)."""
    cases = result["cases"]
    timed = sorted(c["cpu_seconds"] for c in cases if c["kind"] not in ("monotonic", "subprocess"))
    return {
        "configs": result["configs"],
        "gpus": result["gpus"],
        "runs": len(cases),
        "problem_cases": sum(bool(c["problems"]) for c in cases),
        "cpu_seconds": {
            "median": timed[len(timed) // 2],
            "p99": timed[int(len(timed) * 0.99)],
            "max": timed[-1],
        },
        "with_problems": [c for c in cases if c["problems"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="repo configs, 2 GPUs, 1 engine each")
    parser.add_argument("--stem", default="plan_sweep", help="result name under benchmarks/results")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from record import RAW, RESULTS, write_result

    result = sweep(os.environ.get("GPUFLEET_SHARED"), quick=args.quick)
    table = summarize(result)
    RAW.mkdir(parents=True, exist_ok=True)
    (RAW / f"{Path(args.stem).name}_cases.json").write_text(json.dumps(result, default=str))
    write_result(RESULTS / args.stem, slim(result), table)
    print(table)


if __name__ == "__main__":
    main()
