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
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIRS = (
    ROOT / "tests" / "plan" / "data" / "unseen_configs",
    ROOT / "tests" / "plan" / "data" / "modelopt",
    ROOT / "benchmarks" / "data" / "model_configs",
)
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


@dataclass
class Outcome:
    args: list[str]
    code: int
    stdout: str
    stderr: str
    seconds: float  # wall
    plan: dict[str, Any] | None = None
    cpu_seconds: float = 0.0  # this process's CPU time: what other jobs do not inflate
    problems: list[str] = field(default_factory=list)


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


def check_error(o: Outcome) -> list[str]:
    """A refusal must be a clean exit 1 or 2 with a short error naming a flag or field and
    a fix (click's usage errors name the option), never a traceback."""
    problems = []
    if "Traceback" in o.stderr or o.code not in (1, 2):
        problems.append(f"exit {o.code} with a traceback or odd code: {o.stderr.strip()[-300:]}")
        return problems
    lines = [ln for ln in o.stderr.strip().splitlines() if ln.strip()]
    text = " ".join(lines)
    if not lines:
        problems.append("no error message")
    elif "Usage:" in text or "Invalid value" in text or "No such option" in text:
        if "'--" not in text and "Try 'gpufleet" not in text:
            problems.append(f"usage error names no option: {text[:200]}")
    else:
        if len([ln for ln in lines if ln.startswith("error:")]) != 1:
            problems.append(f"not one error line: {text[:300]}")
        if "fix:" not in text:
            problems.append(f"error gives no fix: {text[:300]}")
    return problems


def _finite_nonneg(where: str, value: Any, problems: list[str]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if math.isnan(value) or math.isinf(value) or value < 0:
        problems.append(f"{where} = {value}")


def check_plan(d: dict[str, Any]) -> list[str]:
    """Invariants of one plan (its --json document), physics floors included."""
    from gpufleet.specs import load_gpu
    from gpufleet.specs.dtypes import BYTES_PER_PARAM

    problems: list[str] = []
    gpu = load_gpu(d["gpu"])
    peak_flops = max(gpu.dense_tflops.values()) * 1e12
    phys = d.get("_physics", {})
    for c in d["candidates"]:
        label = c["layout"]["label"]
        m = c["memory"]
        for key in ("usable_bytes", "weights_bytes", "activation_bytes", "kv_bytes_per_token",
                    "kv_capacity_tokens", "kv_tokens_logged", "max_concurrent_seqs"):  # fmt: skip
            _finite_nonneg(f"{label} {key}", m[key], problems)
        if m["kv_capacity_tokens"] <= 0:
            problems.append(f"{label} offered with {m['kv_capacity_tokens']} KV tokens")
        if m["weights_bytes"] > m["gpu_total_bytes"]:
            problems.append(f"{label} weights {m['weights_bytes']:.3g} B > GPU memory")
        p = c["performance"]
        if p is not None:
            for key in ("prefill_s", "ttft_s", "tpot_s", "max_requests_per_s",
                        "max_output_tokens_per_s"):  # fmt: skip
                _finite_nonneg(f"{label} {key}", p[key], problems)
            gpus = c["layout"]["num_gpus"]
            if phys:
                floor_ttft = phys["prefill_flops"] / (gpus * peak_flops)
                if p["ttft_s"] < floor_ttft or p["prefill_s"] < floor_ttft:
                    problems.append(
                        f"{label} TTFT {p['ttft_s']:.3g} s < FLOPs floor {floor_ttft:.3g}"
                    )
                nbytes = phys["active_params"] * BYTES_PER_PARAM[c["layout"]["weight_dtype"]]
                floor_tpot = nbytes / (gpus * gpu.hbm_gbps * 1e9)
                one_token = d["traffic"]["output_tokens"] == 1  # no inter-token time
                if p["tpot_s"] < floor_tpot and not one_token:
                    problems.append(
                        f"{label} TPOT {p['tpot_s']:.3g} s < read floor {floor_tpot:.3g}"
                    )
        for key in ("replicas", "total_gpus", "cost_per_hour_usd",
                    "cost_per_million_output_tokens_usd"):  # fmt: skip
            _finite_nonneg(f"{label} {key}", c[key], problems)
    dis = d.get("disaggregated")
    if dis:
        for key in ("ttft_s", "tpot_s", "kv_transfer_s", "total_gpus", "kv_bytes_per_request"):
            _finite_nonneg(f"disagg {key}", dis[key], problems)
    problems += check_commands(d["launch"])
    if dis and dis.get("launch"):
        problems += check_commands(dis["launch"], disaggregated=True)
    return problems


# Flags as the engines spell them (vLLM engine args, SGLang server args, trtllm-serve).
VLLM_FLAGS = {"--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
              "--enable-expert-parallel", "--distributed-executor-backend",
              "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port",
              "--max-model-len", "--gpu-memory-utilization", "--quantization", "--kv-cache-dtype",
              "--max-num-seqs", "--max-num-batched-tokens", "--port", "--enable-eplb",
              "--headless", "--data-parallel-start-rank", "--trust-remote-code",
              "--enable-prefix-caching",
              "--kv-transfer-config", "--enable-dbo", "--data-parallel-hybrid-lb"}  # fmt: skip
SGLANG_FLAGS = {"--model-path", "--tp-size", "--pp-size", "--dp-size", "--ep-size",
                "--enable-dp-attention", "--context-length", "--mem-fraction-static",
                "--quantization", "--kv-cache-dtype", "--port", "--nnodes", "--node-rank",
                "--dist-init-addr", "--trust-remote-code", "--moe-a2a-backend",
                "--disaggregation-mode", "--disaggregation-transfer-backend", "--host",
                "--max-running-requests", "--chunked-prefill-size"}  # fmt: skip
TRTLLM_FLAGS = {"--tp_size", "--pp_size", "--ep_size", "--max_seq_len", "--kv_cache_free_gpu_memory_fraction",
                "--port", "--backend", "--extra_llm_api_options", "--max_batch_size",
                "--max_num_tokens", "--trust_remote_code", "--host", "--config"}  # fmt: skip


def _flags(cmd: str) -> list[str]:
    """The command's flags as a shell reads it: lines joined at their backslash, and a
    comment on any line but the last is an error (it swallows the backslash, so the shell
    runs the following lines as commands of their own)."""
    lines = cmd.split("\n")
    words: list[str] = []
    for i, line in enumerate(lines):
        body = line[:-1] if line.endswith("\\") else line
        if i < len(lines) - 1 and shlex.split(body, comments=True) != shlex.split(body):
            raise ValueError(f"a comment cuts the command at line {i + 1}: {line.strip()!r}")
        words += shlex.split(body, comments=True)
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]


ROUTER_FLAGS = {"--pd-disaggregation", "--prefill", "--decode", "--host", "--port"}
COMMANDS = {"vllm": VLLM_FLAGS, "sglang": SGLANG_FLAGS, "trtllm": TRTLLM_FLAGS}
DISAGG_COMMANDS = {"vllm_prefill": VLLM_FLAGS, "vllm_decode": VLLM_FLAGS,
                   "vllm_router": ROUTER_FLAGS, "sglang_prefill": SGLANG_FLAGS,
                   "sglang_decode": SGLANG_FLAGS, "sglang_router": ROUTER_FLAGS}  # fmt: skip


def check_commands(launch: dict[str, Any], *, disaggregated: bool = False) -> list[str]:
    """Each launch command parses as a shell line and uses only flags its engine spells,
    each once (the router's --prefill / --decode repeat by design)."""
    problems = []
    for key, known in (DISAGG_COMMANDS if disaggregated else COMMANDS).items():
        cmd = launch.get(key) or ""
        if not cmd:
            problems.append(f"no {key} command")
            continue
        try:
            flags = _flags(cmd)
        except ValueError as e:
            problems.append(f"{key} command does not parse: {e}")
            continue
        unknown = sorted(set(flags) - known)
        if unknown:
            problems.append(f"{key} flags not in the engine's CLI: {unknown}")
        if known is not ROUTER_FLAGS and len(flags) != len(set(flags)):
            problems.append(f"{key} repeats a flag: {flags}")
    return problems


def physics(model_arg: str, input_tokens: int) -> dict[str, float]:
    """Lower bounds the plan may not beat: the prefill's matmul FLOPs (2 × active params
    × prompt tokens, no attention, no LM head) and the active params one token reads."""
    from gpufleet.specs import load_model

    model = load_model(model_arg)
    active = model.active_params() - model.embedding_params()
    matmul = max(0, active - model.lm_head_params())
    return {"prefill_flops": 2.0 * matmul * input_tokens, "active_params": float(active)}


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


@contextlib.contextmanager
def malformed_dir() -> Iterator[Path]:
    """A temporary folder of broken configs (`malformed_cases`)."""
    with tempfile.TemporaryDirectory(prefix="plan_sweep_") as tmp:
        yield Path(tmp)


def malformed_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Broken inputs a user makes: name -> (plan args, the field the error must name).
    Files are named case_N so an error cannot pass by quoting its path."""
    good = json.loads((CONFIG_DIRS[0] / "Qwen--Qwen3-0.6B.json").read_text())
    cases: dict[str, tuple[list[str], str]] = {}

    def config(name: str, text: str, field_name: str, gpu: str = "h100-sxm") -> None:
        path = tmp / f"case_{len(cases)}.json"
        path.write_text(text)
        cases[name] = (["--model", str(path), "--gpu", gpu], field_name)

    for key in ("hidden_size", "num_attention_heads", "vocab_size", "num_hidden_layers"):
        config(
            f"config without {key}", json.dumps({k: v for k, v in good.items() if k != key}), key
        )
    config("num_key_value_heads not dividing heads",
           json.dumps({**good, "num_attention_heads": 16, "num_key_value_heads": 6}),
           "num_key_value_heads")  # fmt: skip
    for key, value in (("hidden_size", -4096), ("num_hidden_layers", 0), ("vocab_size", "big"),
                       ("max_position_embeddings", -1), ("intermediate_size", None),
                       ("num_attention_heads", 0), ("vocab_size", 0), ("head_dim", -128),
                       ("num_key_value_heads", -2)):  # fmt: skip
        config(f"{key} = {value!r}", json.dumps({**good, key: value}), key)
    config("non-JSON config", "{ this is not json", "json", "l4")
    config("JSON that is not an object", "[1, 2, 3]", "config", "l4")
    (tmp / "empty_dir").mkdir()
    cases["directory without config.json"] = (
        ["--model", str(tmp / "empty_dir"), "--gpu", "l4"],
        "config.json",
    )
    short = ROOT / "benchmarks" / "data" / "model_configs" / "meta-llama--Meta-Llama-3-8B.json"
    cases["prompt longer than the model's context"] = (
        ["--model", str(short), "--gpu", "h100-sxm", "--input-tokens", "32000"],
        "--input-tokens",
    )
    model = ["--model", str(CONFIG_DIRS[0] / "Qwen--Qwen3-0.6B.json")]
    cases["unknown --gpu"] = ([*model, "--gpu", "h1000"], "--gpu")
    for flag in ("--rps", "--input-tokens", "--output-tokens", "--max-gpus", "--gpus-per-node",
                 "--max-model-len", "--ttft-slo", "--tpot-slo", "--gpu-price",
                 "--gpu-memory-utilization"):  # fmt: skip
        cases[f"negative {flag}"] = ([*model, "--gpu", "l4", flag, "-1"], flag)
    cases["--gpu-memory-utilization 1.5"] = (
        [*model, "--gpu", "l4", "--gpu-memory-utilization", "1.5"],
        "--gpu-memory-utilization",
    )
    cases["--max-model-len beyond the model"] = (
        [*model, "--gpu", "l4", "--max-model-len", str(10**7)],
        "--max-model-len",
    )
    cases["--max-model-len below the request"] = (
        [*model, "--gpu", "l4", "--max-model-len", "100"],
        "--max-model-len",
    )
    cases["--rps nan"] = ([*model, "--gpu", "l4", "--rps", "nan"], "--rps")
    cases["--rps inf"] = ([*model, "--gpu", "l4", "--rps", "inf"], "--rps")
    cases["--ttft-slo inf"] = ([*model, "--gpu", "l4", "--ttft-slo", "inf"], "--ttft-slo")
    return cases


def check_text(out: str) -> list[str]:
    """The printed plan: its tables and launch lines, no nan / inf figure."""
    problems = []
    for word in out.replace("|", " ").split():
        if word.strip(",;()").lower() in ("nan", "inf", "-inf", "nanx", "infx"):
            problems.append(f"printed plan shows {word!r}")
    for needle in ("Memory per GPU", "Decisions", "Launch (one replica)", "vllm serve"):
        if needle not in out:
            problems.append(f"printed plan lacks {needle!r}")
    return problems


def check_malformed(o: Outcome, field_name: str) -> list[str]:
    """A malformed input must be refused cleanly, naming its field."""
    if o.code == 0:
        return [f"accepted (exit 0): {o.stdout[:120]!r}"]
    problems = check_error(o)
    if field_name.lower() not in o.stderr.lower():
        problems.append(f"error does not name {field_name}: {o.stderr.strip()[-300:]}")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="repo configs, 2 GPUs, 1 engine each")
    parser.add_argument("--stem", default="plan_sweep", help="result name under benchmarks/results")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from record import RESULTS, write_result

    result = sweep(os.environ.get("GPUFLEET_SHARED"), quick=args.quick)
    table = summarize(result)
    result["problem_cases"] = sum(bool(c["problems"]) for c in result["cases"])
    write_result(RESULTS / args.stem, result, table)
    print(table)


if __name__ == "__main__":
    main()
