"""What the simulator replays: requests with an arrival time, a segmented prompt and a
max_tokens. Built from traces (Azure, Mooncake; time-scaled and sliced) or synthetically
(Poisson / gamma arrivals at a fixed, ramped or stepped rate; shared-prefix groups).

The same arrival process (`gpufleet.bench.arrivals`) and length sampler
(`gpufleet.workload.LengthSampler`) as `gpufleet bench`, so a simulated run and a live
benchmark with the same flags and seed send the same request shapes at the same times.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.bench.arrivals import arrival_offsets
from gpufleet.errors import UserError
from gpufleet.sim.prompts import (
    KIND_ANSWER,
    KIND_PREFIX,
    KIND_TRACE_BLOCK,
    KIND_UNIQUE,
    Segments,
    segment_key,
)
from gpufleet.workload.builders import LengthSampler
from gpufleet.workload.traces import MOONCAKE_BLOCK_TOKENS, TraceRecord


@dataclass(frozen=True, slots=True)
class SimRequest:
    index: int
    arrival_s: float  # ignored in closed-loop runs (a client sends when its last one ends)
    segments: Segments
    output_tokens: int  # max_tokens, with EOS ignored (as `bench --ignore-eos`)
    session_key: str | None = None
    prefix_group: int | None = None
    # Multi-turn sessions: sent when request `after` (the previous turn) has finished.
    after: int | None = None

    @property
    def input_tokens(self) -> int:
        return sum(n for _, n in self.segments)


def _unique(seed: int, index: int, n: int) -> tuple[int, int]:
    return (segment_key(KIND_UNIQUE, (seed << 32) | index), n)


def trace_requests(
    records: Sequence[TraceRecord],
    *,
    speedup: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> list[SimRequest]:
    """The records arriving in [start_s, start_s + duration_s) of trace time, shifted to
    start at 0 and played `speedup` times faster. Mooncake `hash_ids` become shared
    512-token segments; the rest of a prompt (and every Azure prompt) is its own."""
    if speedup <= 0:
        raise UserError("must be > 0", field="--speedup", fix="e.g. --speedup 2")
    if start_s < 0:
        raise UserError("must be >= 0", field="--trace-start-s")
    out: list[SimRequest] = []
    end_s = None if duration_s is None else start_s + duration_s
    for rec in records:
        if rec.arrival_s < start_s:
            continue
        if end_s is not None and rec.arrival_s >= end_s:
            break
        if limit is not None and len(out) >= limit:
            break
        n_in = max(1, rec.input_tokens)
        segments: list[tuple[int, int]] = []
        left = n_in
        for h in rec.hash_ids or ():
            if left <= 0:
                break
            take = min(left, MOONCAKE_BLOCK_TOKENS)
            segments.append((segment_key(KIND_TRACE_BLOCK, h), take))
            left -= take
        if left > 0:
            segments.append(_unique(seed, len(out), left))
        out.append(
            SimRequest(
                index=len(out),
                arrival_s=(rec.arrival_s - start_s) / speedup,
                segments=tuple(segments),
                output_tokens=max(1, rec.output_tokens),
            )
        )
    return out


def parse_rate_steps(text: str) -> list[tuple[float, float]]:
    """'2:60,20:120,2:60' -> [(rate_per_s, seconds), ...]."""
    steps: list[tuple[float, float]] = []
    for part in text.split(","):
        rate, sep, secs = part.strip().partition(":")
        try:
            step = (float(rate), float(secs))
        except ValueError:
            step = (-1.0, -1.0)
        if not sep or step[0] < 0 or step[1] <= 0:
            raise UserError(
                f"bad step {part!r}",
                field="--rate-steps",
                fix="RATE:SECONDS pairs separated by commas, e.g. 2:60,20:120,2:60",
            )
        steps.append(step)
    return steps


def _step_offsets(
    steps: Sequence[tuple[float, float]], burstiness: float, rng: random.Random
) -> list[float]:
    """Arrival times of a piecewise-constant-rate gamma process (Poisson at burstiness 1)."""
    out: list[float] = []
    t0 = 0.0
    for rate, secs in steps:
        if rate > 0:
            t = t0
            while True:
                t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
                if t >= t0 + secs:
                    break
                out.append(t)
        t0 += secs
    return out


def synthetic_requests(
    *,
    num_requests: int | None = None,
    rate: float | None = None,
    rate_steps: Sequence[tuple[float, float]] | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
    input_tokens: int = 1024,
    output_tokens: int = 128,
    range_ratio: float = 0.0,
    prefix_groups: int | None = None,
    prefix_tokens: int = 0,
    sessions: int | None = None,
    turns: int = 1,
    seed: int = 0,
) -> list[SimRequest]:
    """Open-loop synthetic requests: `num_requests` at `rate` (or for `duration_s` at
    `rate`), or a stepped rate. Without any rate (closed loop), arrival times are 0.

    With `prefix_groups`, request i starts with group (i mod groups)'s shared
    `prefix_tokens`-token prefix, then its own ~`input_tokens` (as `bench --prefix-groups`).
    With `sessions`, the arrivals start sessions of `turns` turns; turn k+1 resends turns
    1..k and their answers and is sent when turn k ends (as `bench --sessions --turns`).
    """
    if burstiness <= 0:
        raise UserError("must be > 0", field="--burstiness", fix="1 is Poisson")
    if input_tokens < 0 or (input_tokens == 0 and not prefix_tokens):
        raise UserError("must be >= 1", field="--input-tokens")
    if output_tokens < 1:
        raise UserError("must be >= 1", field="--output-tokens")
    if prefix_groups is not None and prefix_groups < 1:
        raise UserError("must be >= 1", field="--prefix-groups")
    if not 0.0 <= range_ratio < 1.0:
        raise UserError("must be in [0, 1)", field="--range-ratio", fix="e.g. 0.5")
    if prefix_tokens and not prefix_groups:
        raise UserError(
            "a shared prefix needs groups", field="--prefix-tokens", fix="add --prefix-groups G"
        )
    if sessions is not None:
        if sessions < 1 or turns < 1:
            raise UserError("sessions and turns must be >= 1", field="--sessions")
        num_requests = sessions
    rng = random.Random(seed)
    if rate_steps:
        offsets = _step_offsets(rate_steps, burstiness, rng)
        if num_requests is not None:
            offsets = offsets[:num_requests]
    elif rate is not None:
        if rate <= 0:
            raise UserError("must be > 0", field="--rate")
        n = num_requests
        if n is None:
            if duration_s is None:
                raise UserError(
                    "an open-loop run needs a length",
                    field="--num-requests",
                    fix="pass --num-requests N or --duration S",
                )
            n = max(1, round(rate * duration_s))
        offsets = arrival_offsets(n, rate, burstiness, rng)
    else:
        if num_requests is None:
            raise UserError("a closed-loop run needs a count", field="--num-requests")
        offsets = [0.0] * num_requests
    lengths_rng = random.Random(seed + 1)
    ins = LengthSampler(input_tokens, range_ratio, lengths_rng) if input_tokens > 0 else None
    outs = LengthSampler(output_tokens, range_ratio, lengths_rng)
    out: list[SimRequest] = []
    if sessions is not None:
        return _session_requests(offsets, turns, ins, outs, seed)
    for i, t in enumerate(offsets):
        segments: list[tuple[int, int]] = []
        group = None
        if prefix_groups:
            group = i % prefix_groups
            if prefix_tokens > 0:
                segments.append((segment_key(KIND_PREFIX, (seed << 20) | group), prefix_tokens))
        if ins is not None:
            segments.append(_unique(seed, i, ins.draw()))
        out.append(SimRequest(i, t, tuple(segments), outs.draw(), prefix_group=group))
    return out


def _session_requests(
    starts: Sequence[float],
    turns: int,
    ins: LengthSampler | None,
    outs: LengthSampler,
    seed: int,
) -> list[SimRequest]:
    out: list[SimRequest] = []
    for s, t0 in enumerate(starts):
        history: list[tuple[int, int]] = []
        prev: int | None = None
        for k in range(turns):
            ident = (s << 16) | k
            user = _unique(seed, (1 << 31) | ident, ins.draw() if ins else 1)
            n_out = outs.draw()
            index = len(out)
            out.append(
                SimRequest(
                    index=index,
                    arrival_s=t0,
                    segments=(*history, user),
                    output_tokens=n_out,
                    session_key=f"session-{s}",
                    after=prev,
                )
            )
            history += [user, (segment_key(KIND_ANSWER, (seed << 32) | ident), n_out)]
            prev = index
    return out
