"""`gpufleet replica`: run a simulated vLLM-compatible replica (no GPU needed).

See `gpufleet.replica.server` for the endpoints and the fault-injection admin API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from gpufleet.errors import UserError
from gpufleet.perf.step_time import LinearStepTimeModel

if TYPE_CHECKING:
    from gpufleet.engine.lora import LoraConfig
    from gpufleet.perf.lora import LoraCost


def _parse_step_time(spec: str) -> LinearStepTimeModel:
    """ "base_s=0.01,per_token_s=2e-5,..." -> LinearStepTimeModel (explicit constants)."""
    fields = {"base_s", "per_token_s", "per_seq_s", "per_context_token_s"}
    values: dict[str, float] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise UserError(
                f"bad item {part!r}",
                field="--step-time",
                fix="write e.g. base_s=0.01,per_token_s=2e-5 (keys: "
                + ", ".join(sorted(fields))
                + ")",
            )
        try:
            values[key] = float(value)
        except ValueError as e:
            raise UserError(f"{key} must be a number", field="--step-time") from e
    return LinearStepTimeModel(**values)


@click.command(name="replica")
@click.option("--model", required=True, help="Model name, e.g. meta-llama/Llama-3.1-8B.")
@click.option(
    "--engine",
    type=click.Choice(["vllm", "sglang"]),
    default="vllm",
    show_default=True,
    help="Whose server it imitates: vLLM's OpenAI server, or SGLang's (native /generate, "
    "/get_server_info, /flush_cache ..., sglang: metric names).",
)
@click.option(
    "--enable-metrics/--no-enable-metrics",
    default=None,
    help="Serve /metrics [default: on for vllm; off for sglang, as SGLang's --enable-metrics].",
)
@click.option("--gpu", default="h100-sxm", show_default=True, help="GPU type, e.g. h100-sxm.")
@click.option("--tp", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--pp", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--ep", default=1, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--quant",
    default="bf16",
    show_default=True,
    help="Weight dtype: bf16, fp8, int8, int4, fp4, or auto (the checkpoint's).",
)
@click.option("--kv-cache-dtype", default="auto", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8001, show_default=True, type=click.IntRange(0, 65535))
@click.option("--served-model-name", multiple=True, help="Name(s) clients use (default: --model).")
@click.option("--max-model-len", default=8192, show_default=True, type=click.IntRange(min=2))
@click.option("--max-num-seqs", default=256, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--max-num-batched-tokens",
    default=None,
    type=click.IntRange(min=1),
    help="Token budget per iteration (default: vLLM's for the GPU, 8192 on >= 70 GiB).",
)
@click.option("--gpu-memory-utilization", default=0.9, show_default=True, type=float)
@click.option(
    "--num-gpu-blocks-override",
    default=None,
    type=click.IntRange(min=1),
    help="Use this many KV blocks instead of the planned number (as vLLM's flag).",
)
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=True)
@click.option(
    "--step-time",
    default=None,
    help="Explicit step-time constants instead of the layout model: "
    "base_s=..,per_token_s=..,per_seq_s=..,per_context_token_s=..",
)
@click.option("--startup-s", default=0.0, show_default=True, type=float, help="Emulated load time.")
@click.option(
    "--time-scale",
    default=1.0,
    show_default=True,
    type=float,
    help="Wall seconds per engine second.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--max-logprobs",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="Most logprobs a request may ask for (vLLM's flag).",
)
@click.option("--enable-lora", is_flag=True, help="Serve LoRA adapters (vLLM's flag).")
@click.option(
    "--max-loras", default=1, show_default=True, type=click.IntRange(min=1),
    help="Adapters one batch may use: the GPU slots.",
)  # fmt: skip
@click.option("--max-lora-rank", default=16, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--max-cpu-loras", default=None, type=click.IntRange(min=1),
    help="Adapters cached in host memory (default: --max-loras).",
)  # fmt: skip
@click.option(
    "--lora-modules", multiple=True,
    help="An adapter to serve from the start: name=path or vLLM's JSON form (repeatable).",
)  # fmt: skip
@click.option(
    "--access-log/--no-access-log", default=False, help="Log every HTTP request to stderr."
)
@click.option(
    "--fail-next", default=0, type=click.IntRange(min=0), help="Fault: fail the next N requests."
)
@click.option(
    "--fail-status", default=503, type=click.IntRange(400, 599), help="Fault: their status."
)
@click.option(
    "--slow-factor", default=1.0, type=float, help="Fault: every iteration takes this x longer."
)
@click.option(
    "--exit-after-s", default=None, type=float, help="Fault: exit abruptly after this long."
)
def command(
    model: str,
    engine: str,
    enable_metrics: bool | None,
    gpu: str,
    tp: int,
    pp: int,
    ep: int,
    quant: str,
    kv_cache_dtype: str,
    host: str,
    port: int,
    served_model_name: tuple[str, ...],
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int | None,
    gpu_memory_utilization: float,
    num_gpu_blocks_override: int | None,
    enable_prefix_caching: bool,
    step_time: str | None,
    startup_s: float,
    time_scale: float,
    seed: int,
    max_logprobs: int,
    enable_lora: bool,
    max_loras: int,
    max_lora_rank: int,
    max_cpu_loras: int | None,
    lora_modules: tuple[str, ...],
    access_log: bool,
    fail_next: int,
    fail_status: int,
    slow_factor: float,
    exit_after_s: float | None,
) -> None:
    """Run a simulated vLLM- or SGLang-compatible replica (OpenAI API, /health, /metrics)."""
    from gpufleet.cli.ports import bind_error, check_port_free
    from gpufleet.engine import EngineConfig
    from gpufleet.plan.profile import replica_profile
    from gpufleet.replica.config import Faults, ReplicaConfig
    from gpufleet.replica.lora import parse_lora_modules
    from gpufleet.replica.server import serve

    check_port_free(host, port)
    if time_scale <= 0:
        raise UserError("must be > 0", field="--time-scale")
    if slow_factor <= 0:
        raise UserError("must be > 0", field="--slow-factor")
    if startup_s < 0:
        raise UserError("must be >= 0", field="--startup-s")
    if not 0 < gpu_memory_utilization <= 1:
        raise UserError("must be in (0, 1]", field="--gpu-memory-utilization")
    profile = replica_profile(
        model,
        gpu,
        tp=tp,
        pp=pp,
        ep=ep,
        quant=quant,
        kv_dtype=kv_cache_dtype,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    try:
        engine_config = EngineConfig.of_replica(
            profile,
            enable_prefix_caching=enable_prefix_caching,
            num_gpu_blocks=num_gpu_blocks_override,
        )
    except ValueError as e:
        raise UserError(str(e), field="--num-gpu-blocks-override") from e
    step_time_model = _parse_step_time(step_time) if step_time else profile.step_time_model
    lora, lora_cost = _lora(model, gpu, tp, enable_lora, max_loras, max_lora_rank, max_cpu_loras)
    config = ReplicaConfig(
        served_model_names=list(served_model_name) or [model],
        engine_config=engine_config,
        step_time_model=step_time_model,
        host=host,
        port=port,
        time_scale=time_scale,
        startup_s=startup_s,
        seed=seed,
        faults=Faults(fail_next=fail_next, fail_status=fail_status, slow_factor=slow_factor),
        exit_after_s=exit_after_s,
        access_log=access_log,
        tp=tp,
        max_logprobs=max_logprobs,
        engine=engine,
        enable_metrics=enable_metrics if enable_metrics is not None else engine == "vllm",
        lora=lora,
        lora_cost=lora_cost,
        lora_modules=parse_lora_modules(lora_modules),
    )
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # uvloop is optional (not on Windows)
        pass
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(config))
    except OSError as e:  # lost a race for the port after the check
        raise bind_error(e, host, port) from None


def _lora(
    model: str,
    gpu: str,
    tp: int,
    enabled: bool,
    max_loras: int,
    max_lora_rank: int,
    max_cpu_loras: int | None,
) -> tuple[LoraConfig | None, LoraCost | None]:
    """The adapter slots and their cost model (gpufleet.perf.lora) with --enable-lora."""
    from gpufleet.engine.lora import LoraConfig
    from gpufleet.perf.lora import lora_cost
    from gpufleet.specs.catalog import load_model
    from gpufleet.specs.gpus import load_gpu

    if not enabled:
        return None, None
    try:
        config = LoraConfig(max_loras, max_lora_rank, max_cpu_loras)
    except ValueError as e:
        raise UserError(str(e), field="--max-cpu-loras") from None
    cost = lora_cost(load_model(model), load_gpu(gpu), tp=tp, max_lora_rank=max_lora_rank)
    return config, cost
