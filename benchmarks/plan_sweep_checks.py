"""The checks of benchmarks/plan_sweep.py: what a plan, a refusal, a launch command and a
printed plan must satisfy, and the malformed inputs a user makes. Invariants, not constants
(see plan_sweep's docstring); no I/O beyond the temporary configs it writes."""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import tempfile
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
