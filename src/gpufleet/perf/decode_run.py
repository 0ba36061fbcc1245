"""The times of a run of decode-only iterations, bit for bit as the roofline gives them.

The engine jumps over runs of decode steps in which only the context grows (one token per
sequence per step). Everything in a decode step's time except attention over the context
depends on the batch size alone: the roofline computes those parts once per batch size
(`DecodeParts`) and this module adds the attention of each step with the very float
operations, in the same order, that `RooflineStepTimeModel.step_time_s` performs, so
stepped and jumped runs agree exactly. Short runs loop in Python; long ones use numpy
(IEEE float64 operations element by element: the same results).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpufleet.perf.step_ends import StepEnds

# Runs at least this long are evaluated with numpy (a fixed cost of ~7 µs, then a few ns a
# step); shorter ones step by step in Python (~0.2 µs a step, ~0.14 µs on the lean path of
# a dense model whose attention is bound one way at every step: numpy pays from ~56 steps).
# Compiled (tools/compile_sim.py), a step of the lean loop costs ~100 instructions and the
# numpy calls ~5,800 a run, so the lean loop runs up to more steps there.
_COMPILED = not __file__.endswith(".py")  # (native.is_compiled's rule; perf may not import it)
VECTOR_MIN_STEPS = 36
LEAN_VECTOR_MIN_STEPS = 64 if _COMPILED else 56
# Lean batches up to this size read their step times from a table by summed context (at
# most this many times max_model_len floats each): a run of TABLE_MIN_STEPS or more costs a
# slice. A power of two's table takes 7 passes to build, another size's 9: those are built
# only up to TABLE_MAX_ODD_CONTEXT (long contexts see too few runs per entry to pay).
TABLE_MAX_BATCH = 8
TABLE_MAX_ODD_CONTEXT = 1 << 15
TABLE_MIN_STEPS = 64 if _COMPILED else 10


@dataclass(frozen=True, slots=True)
class DecodeParts:
    """What a decode-only step of one batch size costs apart from attention over context,
    and the constants that attention needs."""

    layers: tuple[tuple[int, float, float | None, int | None], ...]  # count, GEMM, MoE, window
    tail_s: tuple[float, ...]  # all-reduces, lm_head, PP hops: added in this order
    overhead_s: float
    decode_pair_flops: float  # attention FLOPs per (token, context token) pair
    attn_flops_s: float
    kv_bytes_per_token_layer: float
    hbm_bytes_s: float
    # +1: every decode step's attention is memory-bound, -1: compute-bound, 0: either
    bound: int = field(init=False, default=0)
    # one layer class without window or MoE (dense models): `_ends_one_class`
    one_class: bool = field(init=False, default=False)
    # one layer class without window or MoE, attention bound one way, one tail term: the
    # lean Python path of `decode_run_ends_s`
    lean: bool = field(init=False, default=False)
    # lean, small batches: batch size -> each step's time by summed context, for the
    # contexts seen so far (`_step_times_by_context`; a cache of the very floats)
    step_times: dict[int, npt.NDArray[np.float64]] = field(
        init=False, default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        bound = _bound(self)
        object.__setattr__(self, "bound", bound)
        layers = self.layers
        one_class = len(layers) == 1 and layers[0][2] is None and layers[0][3] is None
        object.__setattr__(self, "one_class", one_class)
        object.__setattr__(self, "lean", one_class and bound != 0 and len(self.tail_s) == 1)


def decode_run_times_s(
    parts: DecodeParts, num_decode: int, context_tokens: int, num_steps: int
) -> list[float]:
    """Each step's time of a decode run of `num_decode` sequences whose summed context is
    `context_tokens` at the first step and grows by `num_decode` a step."""
    if num_steps >= VECTOR_MIN_STEPS:
        return _times_np(parts, num_decode, context_tokens, num_steps)
    n = num_decode
    pair_flops, attn_flops_s = parts.decode_pair_flops, parts.attn_flops_s
    kv_bytes_layer, hbm_bytes_s = parts.kv_bytes_per_token_layer, parts.hbm_bytes_s
    out = []
    for ctx in range(context_tokens, context_tokens + n * num_steps, n):
        dec_ctx_mean = ctx / n
        total = 0.0
        for count, gemm_s, moe_s, window in parts.layers:
            dec_pairs = n * (dec_ctx_mean if window is None else min(dec_ctx_mean, window))
            # step_time_s adds the prefill pairs' FLOPs first: 0.0 here, which changes nothing.
            compute_s = dec_pairs * pair_flops / attn_flops_s
            memory_s = dec_pairs * kv_bytes_layer / hbm_bytes_s
            layer_s = gemm_s + (memory_s if memory_s > compute_s else compute_s)
            if moe_s is not None:
                layer_s += moe_s
            total += count * layer_s
        for part_s in parts.tail_s:
            total += part_s
        out.append(total + parts.overhead_s)
    return out


def decode_run_ends_s(
    parts: DecodeParts,
    num_decode: int,
    context_tokens: int,
    num_steps: int,
    start_s: float,
    extra_s: float | None = None,
) -> Sequence[float]:
    """When each step of that decode run ends, starting at `start_s`: each step's time (plus
    `extra_s`, if given) added to the running sum one at a time, in step order, exactly
    what accumulating `decode_run_times_s` gives (numpy's cumulative sum adds in order)."""
    if parts.lean:
        return decode_run_ends_lean(parts, num_decode, context_tokens, num_steps, start_s, extra_s)
    if num_steps >= VECTOR_MIN_STEPS:
        ends = np.empty(num_steps + 1)
        ends[0] = start_s
        times = ends[1:]
        _total_np(parts, num_decode, context_tokens, num_steps, out=times)
        if extra_s is not None:
            times += extra_s
        np.add.accumulate(ends, out=ends)  # (np.cumsum's own loop, without its wrapper)
        return StepEnds(ends[1:].data)
    if not parts.one_class:
        out = []
        t = start_s
        for step_s in decode_run_times_s(parts, num_decode, context_tokens, num_steps):
            t += step_s if extra_s is None else step_s + extra_s
            out.append(t)
        return out
    return _ends_one_class(parts, num_decode, context_tokens, num_steps, start_s, extra_s)


def _ends_one_class(
    parts: DecodeParts,
    n: int,
    context_tokens: int,
    num_steps: int,
    start_s: float,
    extra_s: float | None,
) -> list[float]:
    """`decode_run_ends_s` for a model of one layer class without window or MoE (dense
    models): the same float operations as `decode_run_times_s` in the same order, summed
    in the same loop (0.0 + count * layer_s is count * layer_s)."""
    count, gemm_s, _, _ = parts.layers[0]
    pair_flops, attn_flops_s = parts.decode_pair_flops, parts.attn_flops_s
    kv_bytes_layer, hbm_bytes_s = parts.kv_bytes_per_token_layer, parts.hbm_bytes_s
    tails = parts.tail_s
    overhead_s = parts.overhead_s
    out: list[float] = []
    t = start_s
    ctx = context_tokens  # (a counted loop: see decode_run_ends_lean)
    for _step in range(num_steps):  # (named: compiled, `_` is boxed)
        dec_pairs = n * (ctx / n)
        compute_s = dec_pairs * pair_flops / attn_flops_s
        memory_s = dec_pairs * kv_bytes_layer / hbm_bytes_s
        total = count * (gemm_s + (memory_s if memory_s > compute_s else compute_s))
        for part_s in tails:
            total += part_s
        step_s = total + overhead_s
        t += step_s if extra_s is None else step_s + extra_s
        out.append(t)  # (a method call: a bound method kept in a local is generic compiled)
        ctx += n
    return out


def decode_run_ends_lean(
    parts: DecodeParts,
    n: int,
    context_tokens: int,
    num_steps: int,
    start_s: float,
    extra_s: float | None,
) -> Sequence[float]:
    """`_ends_one_class` where attention is bound one way at every step (`parts.bound`,
    so the comparison's pick is known) and one tail term: the same float operations in
    the same order, written as one expression (evaluated left to right as the statements
    it replaces: count * layer_s, + the tail, + the overhead, then added to the clock);
    long runs with numpy, element by element."""
    count, gemm_s, _, _ = parts.layers[0]
    per_pair, rate = _bound_side(parts)
    (tail_s,) = parts.tail_s
    overhead_s = parts.overhead_s
    x: npt.NDArray[np.float64]
    stop = context_tokens + n * num_steps
    if (
        n <= TABLE_MAX_BATCH
        and num_steps >= TABLE_MIN_STEPS
        and (not n & (n - 1) or stop <= TABLE_MAX_ODD_CONTEXT)
    ):
        x = _step_times_by_context(parts, n, stop)[context_tokens:stop:n].copy()
        if extra_s is not None:
            x += extra_s
        x[0] += start_s  # (the clock's first addition; the rest accumulate in order)
        np.add.accumulate(x, out=x)
        return StepEnds(x.data)
    if num_steps >= LEAN_VECTOR_MIN_STEPS:  # the same operations on arrays, in place
        contexts = np.arange(context_tokens, context_tokens + n * num_steps, n, dtype=np.int64)
        x = _lean_step_times(parts, n, contexts)
        if extra_s is not None:
            x += extra_s
        x[0] += start_s  # (the clock's first addition; the rest accumulate in order)
        np.add.accumulate(x, out=x)
        return StepEnds(x.data)
    out: list[float] = []
    t = start_s
    ctx = context_tokens  # (a counted loop: compiled, a range with a variable step iterates
    if extra_s is None:  # generically, ~100 instructions a step)
        for _step in range(num_steps):
            t += count * (gemm_s + n * (ctx / n) * per_pair / rate) + tail_s + overhead_s
            out.append(t)
            ctx += n
    else:
        for _step in range(num_steps):
            t += count * (gemm_s + n * (ctx / n) * per_pair / rate) + tail_s + overhead_s + extra_s
            out.append(t)
            ctx += n
    return out


def _step_times_by_context(parts: DecodeParts, n: int, stop: int) -> npt.NDArray[np.float64]:
    """A lean batch of `n`'s step time for every summed context below `stop` (at least):
    `decode_run_ends_lean`'s element operations on contexts 0, 1, 2, ..., grown by
    doubling (with n fixed the time depends on the summed context alone), so a run reads
    every n-th entry."""
    held = parts.step_times.get(n)
    if held is not None and len(held) >= stop:
        return held
    size = max(stop, 2 * len(held) if held is not None else 4096)
    x = _lean_step_times(parts, n, np.arange(size, dtype=np.int64))
    parts.step_times[n] = x
    return x


def _lean_step_times(
    parts: DecodeParts, n: int, contexts: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """A lean batch of `n`'s step time at each summed context: `decode_run_ends_lean`'s
    loop expression, element by element in the same order (bit-identical to it)."""
    count, gemm_s, _, _ = parts.layers[0]
    per_pair, rate = _bound_side(parts)
    x: npt.NDArray[np.float64]
    if n & (n - 1):
        x = contexts / n
        x *= n
        x *= per_pair
    else:  # n * (ctx / n) is ctx itself for a power of two (exact halvings)
        x = contexts * per_pair  # type: ignore[assignment]
    x /= rate
    x += gemm_s
    x *= count
    x += parts.tail_s[0]
    x += parts.overhead_s
    return x


def _bound_side(parts: DecodeParts) -> tuple[float, float]:
    """(per decode pair, per second) of the side attention is bound by at every step of a
    lean model: KV bytes and HBM bandwidth, or FLOPs and attention throughput."""
    if parts.bound > 0:
        return parts.kv_bytes_per_token_layer, parts.hbm_bytes_s
    return parts.decode_pair_flops, parts.attn_flops_s


def _times_np(parts: DecodeParts, n: int, context_tokens: int, num_steps: int) -> list[float]:
    result: list[float] = _total_np(parts, n, context_tokens, num_steps).tolist()
    return result


def _bound(parts: DecodeParts) -> int:
    """+1 when every decode step's attention is memory-bound, -1 when compute-bound, 0 when
    it may be either. Both costs are the pairs times a constant (each rounded twice, a
    relative 4.5e-16 at most), so constants a 1e-9 apart order them at every step."""
    memory = parts.kv_bytes_per_token_layer / parts.hbm_bytes_s
    compute = parts.decode_pair_flops / parts.attn_flops_s
    if memory > compute * (1.0 + 1e-9):
        return 1
    if compute > memory * (1.0 + 1e-9):
        return -1
    return 0


def _total_np(
    parts: DecodeParts,
    n: int,
    context_tokens: int,
    num_steps: int,
    out: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.float64]:
    """The steps' times (into `out` if given), with step_time_s's float operations in its
    order: in-place numpy operations round exactly as the expressions they replace (the
    bound side for the comparison's pick, count * layer_s for 0.0 + count * layer_s)."""
    ctx = np.arange(context_tokens, context_tokens + n * num_steps, n, dtype=np.int64)
    dec_ctx_mean = ctx / n
    total = np.empty(num_steps) if out is None else out
    first = True
    bound = parts.bound
    for count, gemm_s, moe_s, window in parts.layers:
        mean = dec_ctx_mean if window is None else np.minimum(dec_ctx_mean, float(window))
        dec_pairs = mean * n
        if bound > 0:
            layer_s = np.multiply(dec_pairs, parts.kv_bytes_per_token_layer, out=dec_pairs)
            layer_s /= parts.hbm_bytes_s
        elif bound < 0:
            layer_s = np.multiply(dec_pairs, parts.decode_pair_flops, out=dec_pairs)
            layer_s /= parts.attn_flops_s
        else:
            compute_s = dec_pairs * parts.decode_pair_flops
            compute_s /= parts.attn_flops_s
            memory_s = np.multiply(dec_pairs, parts.kv_bytes_per_token_layer, out=dec_pairs)
            memory_s /= parts.hbm_bytes_s
            layer_s = np.maximum(memory_s, compute_s, out=memory_s)
        layer_s += gemm_s
        if moe_s is not None:
            layer_s += moe_s
        if first:
            np.multiply(layer_s, count, out=total)
            first = False
        else:
            layer_s *= count
            total += layer_s
    if first:
        total[:] = 0.0
    for part_s in parts.tail_s:
        total += part_s
    total += parts.overhead_s
    return total
