"""A scenario: everything one simulated run needs, as plain picklable values.

The CLI fills one from its flags; a sweep copies it with one field changed per run and
fans the copies out over local processes (one scenario per task, as DESIGN.md asks of
large sweeps; Ray can take the same function later).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.policies import make_policy as make_scaling_policy
from gpufleet.engine import EngineConfig
from gpufleet.engine.lora import LoraConfig
from gpufleet.errors import UserError
from gpufleet.perf.lora import lora_cost_of
from gpufleet.plan.capacity import DEFAULT_TOKENS_PER_REQUEST, concurrent_sequences
from gpufleet.routing import make_policy as make_routing_policy
from gpufleet.sim.config import AutoscaleSpec, SimConfig, SimLora
from gpufleet.sim.fleet_spec import SimFleetSpec
from gpufleet.sim.groups import build_faults, build_groups, build_tenants
from gpufleet.sim.report import summarize
from gpufleet.sim.results import SimResult
from gpufleet.sim.simulator import FleetSimulator, Progress
from gpufleet.specs import load_model
from gpufleet.workload import (
    AdapterPopularity,
    RatePhase,
    SimRequest,
    WorkloadSpec,
    read_trace,
    sim_requests,
    slice_records,
    spec_from_flags,
    synthetic_shapes,
    tile_records,
    trace_shapes,
    with_adapters,
)


@dataclass(frozen=True)
class Scenario:
    # replica layout (as `gpufleet replica` / `gpufleet plan`)
    model: str = "meta-llama/Llama-3.1-8B"
    gpu: str = "h100-sxm"
    tp: int = 1
    pp: int = 1
    ep: int = 1
    quant: str = "bf16"
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    # workload
    trace: str | None = None
    trace_format: str = "auto"
    speedup: float = 1.0
    trace_copies: int = 1  # interleaved copies: N times the trace's rate, its shape kept
    trace_start_s: float = 0.0
    duration_s: float | None = None
    num_requests: int | None = None
    rate: float | None = None
    rate_steps: tuple[RatePhase, ...] = ()
    concurrency: int | None = None  # closed loop
    burstiness: float = 1.0
    input_tokens: int = 1024
    output_tokens: int = 128
    range_ratio: float = 0.0
    prefix_groups: int | None = None
    prefix_tokens: int = 0
    sessions: int | None = None
    turns: int = 1
    seed: int = 0
    # LoRA: requests ask for one of N adapters, Zipf(s) popular (`--lora-adapters`)
    lora_adapters: int | None = None
    lora_zipf: float = 1.0
    max_loras: int = 1
    max_lora_rank: int = 16
    # fleet
    replicas: int = 1
    routing: str = "round_robin"
    routing_options: tuple[tuple[str, Any], ...] = ()
    autoscale: str | None = None
    autoscale_params: tuple[tuple[str, Any], ...] = ()
    min_replicas: int = 1
    max_replicas: int = 8
    startup_s: float = 30.0
    autoscale_interval_s: float = 1.0
    drain_deadline_s: float = 60.0
    scrape_interval_s: float = 1.0
    signals_window_s: float = 60.0
    slow_start_s: float = 0.0  # a replica that becomes ready ramps its share (0: off)
    queue_timeout_s: float = 60.0
    queue_max_size: int = 256
    tail_s: float = 0.0
    max_attempts: int = 3  # the gateway's limits.max_attempts
    # what it costs and how it fails
    gpu_price: float | None = None  # $ per GPU-hour (default: the GPU catalog's)
    mtbf_s: float | None = None  # replica failures (default: the config's `failures`)
    restart_crashed: bool = True
    # the replica's --time-scale: every engine step takes this many times its modelled time
    time_scale: float = 1.0
    request_overhead_s: float = 0.0  # the live HTTP path before the engine sees a request
    tick_phase_s: float = 0.0  # the autoscaler's first tick
    scrape_phase_s: float = 0.0  # the gateway's first scrape (0: one interval in)
    # --config: replica groups, tenants, failures (`gpufleet.sim.fleet_spec`)
    fleet: SimFleetSpec | None = None
    name: str = field(default="", compare=False)

    def with_field(self, key: str, value: Any) -> Scenario:
        return dataclasses.replace(self, **{key: value})


def build_requests(sc: Scenario) -> list[SimRequest]:
    """The scenario's requests, from the workload model `gpufleet bench` uses too."""
    if sc.trace:
        if not sc.speedup > 0:
            raise UserError("must be > 0", field="--speedup", fix="e.g. --speedup 2")
        if sc.trace_start_s < 0:
            raise UserError("must be >= 0", field="--trace-start-s")
        if sc.trace_copies < 1:
            raise UserError("must be >= 1", field="--trace-copies", fix="e.g. 10 for 10x the rate")
        records = slice_records(
            tile_records(read_trace(sc.trace, fmt=sc.trace_format), sc.trace_copies),
            start_s=sc.trace_start_s,
            duration_s=sc.duration_s,
            limit=sc.num_requests,
        )
        shapes = trace_shapes(records, speedup=sc.speedup, seed=sc.seed)
    else:
        shapes = synthetic_shapes(workload_spec(sc))
    if sc.lora_adapters is not None:
        try:
            popularity = AdapterPopularity(sc.lora_adapters, sc.lora_zipf, seed=sc.seed)
        except ValueError as e:
            raise UserError(str(e), field="--lora-adapters / --lora-zipf") from None
        shapes = with_adapters(shapes, popularity)
    return sim_requests(shapes)


def sim_lora(sc: Scenario) -> SimLora | None:
    """Replicas with --enable-lora when the workload asks for adapters."""
    if sc.lora_adapters is None:
        return None
    try:
        config = LoraConfig(max_loras=sc.max_loras, max_lora_rank=sc.max_lora_rank)
    except ValueError as e:
        raise UserError(str(e), field="--max-loras") from None
    cost = lora_cost_of(sc.model, sc.gpu, tp=sc.tp, max_lora_rank=sc.max_lora_rank)
    return SimLora(config, cost, rank=sc.max_lora_rank)


def workload_spec(sc: Scenario) -> WorkloadSpec:
    """A synthetic scenario's workload; a bad setting is a UserError naming its flag."""
    checks = (
        (sc.burstiness > 0, "--burstiness", "must be > 0", "1 is Poisson"),
        (sc.input_tokens >= 1 or sc.prefix_tokens > 0, "--input-tokens", "must be >= 1", ""),
        (sc.output_tokens >= 1, "--output-tokens", "must be >= 1", ""),
        (sc.prefix_groups is None or sc.prefix_groups >= 1, "--prefix-groups", "must be >= 1", ""),
        (0.0 <= sc.range_ratio < 1.0, "--range-ratio", "must be in [0, 1)", "e.g. 0.5"),
        (not sc.prefix_tokens or bool(sc.prefix_groups), "--prefix-tokens",
         "a shared prefix needs groups", "add --prefix-groups G"),
        (sc.sessions is None or min(sc.sessions, sc.turns, sc.input_tokens) >= 1, "--sessions",
         "sessions, turns and their input tokens must be >= 1", ""),
        (sc.rate is None or sc.rate > 0, "--rate", "must be > 0", ""),
    )  # fmt: skip
    for ok, flag, message, fix in checks:
        if not ok:
            raise UserError(message, field=flag, fix=fix or None)
    count = sc.sessions if sc.sessions is not None else sc.num_requests
    open_rate = sc.rate if sc.concurrency is None else None
    if sc.rate_steps:
        pass  # the schedule ends the arrivals
    elif open_rate is not None:
        if count is None and sc.duration_s is None:
            raise UserError(
                "an open-loop run needs a length",
                field="--num-requests",
                fix="pass --num-requests N or --duration S",
            )
    elif count is None:
        raise UserError("a closed-loop run needs a count", field="--num-requests")
    rate = open_rate if open_rate is not None else math.inf
    return spec_from_flags(sc, conversations=count, rate=rate, schedule=sc.rate_steps)


def build_config(sc: Scenario) -> SimConfig:
    if not sc.time_scale > 0:
        raise UserError("must be > 0", field="--time-scale", fix="1 is real time")
    if sc.request_overhead_s < 0:
        raise UserError("must be >= 0", field="--request-overhead-s")
    groups = build_groups(sc)
    scaled_group = next((g for g in groups if g.autoscaled), groups[0])
    engine = scaled_group.engine
    autoscale = None
    if sc.autoscale:
        bounds = ReplicaBounds(sc.min_replicas, sc.max_replicas)
        autoscale = AutoscaleSpec(
            policy=make_scaling_policy(sc.autoscale, bounds, _policy_params(sc, engine)),
            interval_s=sc.autoscale_interval_s,
            startup_s=sc.startup_s,
            drain_deadline_s=sc.drain_deadline_s,
        )
    for name in ("scrape_interval_s", "signals_window_s", "queue_timeout_s", "speedup"):
        if getattr(sc, name) <= 0:
            raise UserError("must be > 0", field="--" + name.replace("_", "-"))
    if sc.autoscale_interval_s <= 0 or sc.startup_s < 0 or sc.drain_deadline_s <= 0:
        raise UserError(
            "autoscale interval and drain deadline must be > 0, startup >= 0",
            field="--autoscale-interval-s",
        )
    if sc.queue_max_size < 0:
        raise UserError("must be >= 0", field="--queue-max-size")
    if not sc.slow_start_s >= 0:
        raise UserError("must be >= 0", field="--slow-start-s", fix="0 turns slow start off")
    if not sc.autoscale and sc.fleet is None and sc.replicas < 1:
        raise UserError("must be >= 1", field="--replicas", fix="or pass --autoscale POLICY")
    if not 1 <= sc.max_attempts <= 10:
        raise UserError("must be in 1..10", field="--max-attempts", fix="3 is the gateway's")
    fleet = sc.fleet
    return SimConfig(
        engine=engine,
        step_time_model=scaled_group.step_time_model,
        model=load_model(sc.model).name,
        replicas=sum(g.replicas for g in groups),
        autoscale=autoscale,
        groups=groups,
        tenants=build_tenants(sc),
        faults=build_faults(sc),
        max_attempts=fleet.max_attempts if fleet and fleet.max_attempts else sc.max_attempts,
        request_overhead_s=sc.request_overhead_s,
        tick_phase_s=sc.tick_phase_s,
        scrape_phase_s=sc.scrape_phase_s,
        scrape_interval_s=sc.scrape_interval_s,
        signals_window_s=sc.signals_window_s,
        slow_start_s=sc.slow_start_s,
        queue_timeout_s=sc.queue_timeout_s,
        queue_max_size=sc.queue_max_size,
        closed_loop_clients=sc.concurrency,
        tail_s=sc.tail_s,
        seed=sc.seed,
        lora=sim_lora(sc),
    )


def _policy_params(sc: Scenario, engine: EngineConfig) -> dict[str, Any]:
    """The scaling policy's parameters; capacity_per_replica, when the policy takes one
    and the user did not set it, is the plan's concurrent sequences of this replica."""
    params = dict(sc.autoscale_params)
    if sc.autoscale not in ("default", "queue_depth") or "capacity_per_replica" in params:
        return params
    if sc.trace:  # the trace is read later; assume the plan's default request
        tokens, where = DEFAULT_TOKENS_PER_REQUEST, "default request 1024 in + 256 out"
    else:
        tokens = sc.input_tokens + sc.output_tokens
        where = f"workload {sc.input_tokens} in + {sc.output_tokens} out"
    kv_tokens = engine.num_gpu_blocks * engine.block_size
    params["capacity_per_replica"] = concurrent_sequences(engine.max_num_seqs, kv_tokens, tokens)
    params.setdefault(
        "capacity_source",
        f"plan: min(max_num_seqs {engine.max_num_seqs}, {kv_tokens} KV tokens / "
        f"{tokens} per request = {where})",
    )
    return params


def run_scenario_result(
    sc: Scenario, progress: Callable[[Progress], None] | None = None
) -> SimResult:
    config = build_config(sc)
    requests = build_requests(sc)
    if not requests:
        raise UserError(
            "the workload has no requests",
            field="--trace" if sc.trace else "--num-requests",
            fix="widen --duration / --trace-start-s, or raise --num-requests",
        )
    routing = make_routing_policy(sc.routing, seed=sc.seed, **dict(sc.routing_options))
    return FleetSimulator(config, requests, routing).run(progress)


def run_scenario(sc: Scenario) -> dict[str, Any]:
    """Run one scenario; its summary (see `gpufleet.sim.report.summarize`)."""
    summary = summarize(run_scenario_result(sc))
    summary["scenario"] = sc.name or sc.routing
    return summary


def run_many(
    scenarios: Sequence[Scenario],
    workers: int | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run scenarios side by side in local processes; summaries in the order given.
    `on_done(n)` is told how many have finished, as each one does."""
    if not scenarios:
        return []
    workers = workers or min(len(scenarios), os.cpu_count() or 1)
    out: list[dict[str, Any] | None] = [None] * len(scenarios)
    if workers <= 1 or len(scenarios) == 1:
        for i, sc in enumerate(scenarios):
            out[i] = run_scenario(sc)
            if on_done is not None:
                on_done(i + 1)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(run_scenario, sc): i for i, sc in enumerate(scenarios)}
            for done, future in enumerate(as_completed(futures), start=1):
                out[futures[future]] = future.result()
                if on_done is not None:
                    on_done(done)
    return [s for s in out if s is not None]
