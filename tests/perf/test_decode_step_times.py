"""The step-time models' decode-run fast path gives `step_time_s`'s very floats."""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import accumulate

import pytest

from gpufleet.perf.roofline import RooflineStepTimeModel
from gpufleet.perf.step_time import (
    DecodeStepTimes,
    LinearStepTimeModel,
    StepBatch,
    StepTimeModel,
    decode_step_ends_fn,
    decode_step_times_fn,
)
from gpufleet.plan.layout import Layout
from gpufleet.specs.catalog import load_model
from gpufleet.specs.gpus import load_gpu

LAYOUTS = [
    # dense, GQA; TP all-reduces; PP hops
    ("meta-llama/Llama-3.1-8B", "h100-sxm", Layout(tp=1, pp=1, ep=1)),
    # attention data parallelism: the MoE layers see every rank's tokens
    ("deepseek-ai/DeepSeek-V3", "h200", Layout(tp=2, dp=4, pp=1, ep=8, weight_dtype="fp8")),
    ("meta-llama/Llama-3.1-70B", "h100-sxm", Layout(tp=4, pp=2, ep=1, weight_dtype="fp8")),
    # MoE with sliding-window layers, MXFP4 experts
    ("openai/gpt-oss-20b", "h100-sxm", Layout(tp=2, pp=1, ep=2, weight_dtype="mxfp4")),
    # MLA + MoE, expert parallel, fp8 KV
    (
        "deepseek-ai/DeepSeek-V3",
        "h200",
        Layout(tp=8, pp=2, ep=8, weight_dtype="fp8", kv_dtype="fp8"),
    ),
    ("mistralai/Mixtral-8x7B-v0.1", "a100-80gb", Layout(tp=2, pp=1, ep=1)),
]


def one_by_one(model: StepTimeModel, n: int, context: int, steps: int) -> list[float]:
    return [
        model.step_time_s(StepBatch(num_decode=n, decode_context_tokens=context + n * k))
        for k in range(steps)
    ]


def summed(times: list[float], start_s: float, extra_s: float | None) -> list[float]:
    """The step ends as the engine once added them up: one step after another."""
    if extra_s is not None:
        times = [t + extra_s for t in times]
    return list(accumulate(times, initial=start_s))[1:]


@pytest.mark.parametrize(("name", "gpu", "layout"), LAYOUTS)
@pytest.mark.parametrize("graph_max", [None, 16])  # batches above 16 pay eager launches
def test_roofline_decode_runs_are_bit_identical(
    name: str, gpu: str, layout: Layout, graph_max: int | None
) -> None:
    model = RooflineStepTimeModel(
        load_model(name), load_gpu(gpu), layout, cuda_graph_max_batch=graph_max
    )
    assert isinstance(model, DecodeStepTimes)
    rng = random.Random(name)
    # Python below 36 steps, numpy from 36; the lean Python path (one dense layer class)
    # below 56, numpy from 56
    for steps in (1, 2, 5, 35, 36, 55, 56, 300) * 4:
        n = rng.choice([1, 3, 7, 17, 97, 255, 256])
        # contexts that cross the sliding windows (gpt-oss: 128 tokens) within the run
        context = n * rng.choice([0, 1, 100, 127, 4000]) + rng.randrange(n)
        fast = model.decode_step_times_s(n, context, steps)
        assert fast == one_by_one(model, n, context, steps)
        assert all(isinstance(t, float) for t in fast)
        start, extra = rng.choice([0.0, 12.345678, 1e5 + 0.1]), rng.choice([None, 3.3e-4])
        ends = decode_step_ends_fn(model)(n, context, steps, start, extra)
        assert ends == summed(one_by_one(model, n, context, steps), start, extra)
        assert all(isinstance(t, float) for t in ends)


def test_linear_model_and_the_fallback_are_bit_identical() -> None:
    linear = LinearStepTimeModel(
        base_s=0.0031, per_token_s=7.3e-5, per_seq_s=1.1e-4, per_context_token_s=3.7e-7
    )

    @dataclass(frozen=True)
    class Plain:  # no fast path: the engine calls step_time_s per step
        inner: StepTimeModel

        def step_time_s(self, batch: StepBatch) -> float:
            return self.inner.step_time_s(batch)

    for n, context, steps in ((1, 0, 5), (7, 1234, 90), (64, 64 * 900 + 5, 3)):
        expected = one_by_one(linear, n, context, steps)
        assert linear.decode_step_times_s(n, context, steps) == expected
        assert decode_step_times_fn(linear)(n, context, steps) == expected
        assert decode_step_times_fn(Plain(linear))(n, context, steps) == expected
        for extra in (None, 2.5e-4):
            ends = summed(expected, 7.25, extra)
            assert decode_step_ends_fn(linear)(n, context, steps, 7.25, extra) == ends
            assert decode_step_ends_fn(Plain(linear))(n, context, steps, 7.25, extra) == ends


@pytest.mark.parametrize("bound", ["memory", "compute"])
def test_lean_decode_run_ends_match_the_general_loop(bound: str) -> None:
    """The lean path (one dense layer class, attention bound one way, one tail term) adds
    the general loop's floats in its order, in Python, with numpy, and from the table of
    step times by context (which grows as contexts do)."""
    from gpufleet.perf.decode_run import DecodeParts, _ends_one_class, decode_run_ends_lean

    kv_bytes, flops = (4.1e3, 1.7) if bound == "memory" else (1.3, 9.7e4)
    parts = DecodeParts(((32, 1.5e-4, None, None),), (3.7e-4,), 2.2e-3, flops, 7.9e14,
                        kv_bytes, 3.35e12)  # fmt: skip
    assert parts.lean and parts.bound == (1 if bound == "memory" else -1)
    rng = random.Random(bound)
    for steps in (1, 7, 9, 10, 55, 56, 57, 63, 64, 65, 400, 5000):  # (the table: n <= 8
        # from 10 steps interpreted, 64 compiled)
        for n in (1, 2, 3, 4, 5, 8, 9, 64, 97, 256):
            # (short contexts too: batches of other sizes than powers of two read a table
            # only up to TABLE_MAX_ODD_CONTEXT)
            context = n * rng.randrange(0, 3000 if steps % 2 == 0 else 100_000) + rng.randrange(n)
            for start, extra in ((0.0, None), (1234.5678, 2.5e-4)):
                lean = decode_run_ends_lean(parts, n, context, steps, start, extra)
                assert lean == _ends_one_class(parts, n, context, steps, start, extra)
