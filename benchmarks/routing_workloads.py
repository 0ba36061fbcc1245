"""Workloads for the routing benchmarks: Mooncake/Azure trace slices and the synthetic
prefix-sharing workloads of `gpufleet.workload.prefix_sharing`, as timed chat prompts.

A source is a trace path (Mooncake JSONL with hash_ids, or an Azure CSV) or
`synthetic:NAME[@SEED]` (NAME one of system_prompts, multi_turn, tool_agent, mixed; SEED
the workload's, 0 by default). Shared by
`routing_quality.py` (live replicas) and `routing_replay.py` (the engine-free replay).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SYNTHETIC = "synthetic:"
# Seconds of synthetic workload and its request rate (before any speed-up): ~4 req/s is
# about the Mooncake conversation trace's own pace.
SYNTHETIC_DURATION_S = 300.0
SYNTHETIC_RATE_PER_S = 4.0


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    text: str
    input_tokens: int
    output_tokens: int
    session: str


def source_label(source: str) -> str:
    return source[len(SYNTHETIC) :] if source.startswith(SYNTHETIC) else Path(source).stem


def load_requests(
    source: str, offset: int, count: int, speedup: float, max_output_tokens: int
) -> list[TraceRequest]:
    """`count` requests of `source` from its `offset`-th, arrivals at `speedup` x pace."""
    from gpufleet.errors import UserError
    from gpufleet.workload import read_trace, slice_records, text_conversations, trace_shapes
    from gpufleet.workload.prefix_sharing import prefix_sharing_shapes

    if source.startswith(SYNTHETIC):
        # synthetic:NAME@SEED draws another instance of the workload (other prompt lengths,
        # popularity ranks and arrivals), to tell a rule that generalises from one that fits
        # the one instance.
        name, _, seed = source[len(SYNTHETIC) :].partition("@")
        shapes = prefix_sharing_shapes(
            name,
            duration_s=SYNTHETIC_DURATION_S,
            rate_per_s=SYNTHETIC_RATE_PER_S,
            seed=int(seed or 0),
        )[offset : offset + count]
        if not shapes:
            raise SystemExit(f"{source}: no requests at offset {offset}")
        t0 = shapes[0].arrival_s
        shapes = [dataclasses.replace(s, arrival_s=(s.arrival_s - t0) / speedup) for s in shapes]
        sessions = [s.session_key or f"group-{s.prefix_group}" for s in shapes]
    else:
        try:
            records = read_trace(source, limit=offset + count)[offset:]
        except UserError as e:
            raise SystemExit(f"{e} (pass a trace or set GPUFLEET_SHARED)") from None
        if not records:
            raise SystemExit(f"{source}: no records at offset {offset}")
        records = slice_records(records, start_s=records[0].arrival_s)
        shapes = list(trace_shapes(records, speedup=speedup))
        # A conversation's turns share their leading blocks; name the session by them so
        # the `session` policy has a key a client would send (the trace has none).
        sessions = [
            "conv-" + "-".join(str(h) for h in rec.hash_ids[:2]) if rec.hash_ids else f"req-{i}"
            for i, rec in enumerate(records)
        ]
    out = []
    for conv, session in zip(text_conversations(shapes), sessions, strict=True):
        turn = conv.turns[0]
        out.append(
            TraceRequest(
                arrival_s=conv.arrival_s or 0.0,
                text=turn.text,
                input_tokens=turn.input_tokens,
                output_tokens=min(turn.output_tokens, max_output_tokens),
                session=session,
            )
        )
    return out


@dataclass(frozen=True)
class HashedRequest:
    """A request as the gateway (256-byte text blocks) and the engine (token blocks) see it."""

    arrival_s: float
    routing_hashes: tuple[int, ...]
    engine_hashes: tuple[int, ...]
    prompt_tokens: int
    prompt_bytes: int
    output_tokens: int
    session: str


def hash_requests(
    requests: Sequence[TraceRequest], block_size: int, routing_block_bytes: int = 256
) -> list[HashedRequest]:
    """Each prompt rendered with the chat template, hashed as the gateway and the engine
    hash it. Cached on disk (a temp dir) by content, since building them takes seconds."""
    from gpufleet.routing.prefix import text_prefix_hashes
    from gpufleet.tokenizer import apply_chat_template, block_hashes, default_tokenizer

    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{block_size}|{routing_block_bytes}".encode())
    for r in requests:
        digest.update(f"{r.arrival_s}|{r.output_tokens}|{r.session}|".encode())
        digest.update(r.text.encode())
    cache_dir = Path(os.environ.get("GPUFLEET_REPLAY_CACHE", tempfile.gettempdir()))
    path = cache_dir / f"gpufleet-hashed-{digest.hexdigest()}.pkl"
    if path.is_file():
        with path.open("rb") as f:
            cached: list[HashedRequest] = pickle.load(f)
        return cached
    tok = default_tokenizer()
    out = []
    for r in requests:
        text = apply_chat_template([{"role": "user", "content": r.text}])
        ids = tok.encode(text)
        out.append(
            HashedRequest(
                arrival_s=r.arrival_s,
                routing_hashes=text_prefix_hashes(text, routing_block_bytes),
                engine_hashes=tuple(block_hashes(ids, block_size)),
                prompt_tokens=len(ids),
                prompt_bytes=len(text.encode()),
                output_tokens=r.output_tokens,
                session=r.session,
            )
        )
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        pickle.dump(out, f)
    tmp.replace(path)
    return out
