"""Readers for request traces (Azure LLM 2023 CSV, Mooncake JSONL; plain or gzipped).

Both give `TraceRecord`s with arrival times in seconds from the trace's first request.
A malformed line is a `UserError` naming the file and line, never a silent skip.
`sample:mooncake` and `sample:azure` name the samples shipped with the package (the
first rows of each public trace, see `data/README.md`); the full traces are optional.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import IO

from gpufleet.errors import UserError

# Mooncake's hash_ids name one 512-token block each (FAST'25 release README).
MOONCAKE_BLOCK_TOKENS = 512
SAMPLE_TRACES = {
    "mooncake": "mooncake_conversation_sample.jsonl.gz",
    "azure": "azure_llm_2023_conv_sample.csv.gz",
}
_SAMPLE_PREFIX = "sample:"


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace. `hash_ids` (Mooncake) names its prompt blocks in order."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None


def _parse_azure_timestamp(text: str) -> tuple[datetime, float]:
    """'2023-11-16 18:15:46.6805900' -> (whole seconds, fraction); any fraction length.

    Kept apart so differences stay exact to the trace's 100 ns instead of losing digits
    in a large POSIX float.
    """
    whole, _, frac = text.strip().partition(".")
    fraction = 0.0
    if frac:
        if not frac.isdigit():
            raise ValueError(f"bad fractional seconds {frac!r}")
        fraction = int(frac) / 10 ** len(frac)
    return datetime.fromisoformat(whole), fraction


def trace_path(name: str | Path) -> Path:
    """A trace file: a path, or `sample:NAME` for a sample shipped with the package."""
    text = str(name)
    if not text.startswith(_SAMPLE_PREFIX):
        return Path(name)
    sample = text[len(_SAMPLE_PREFIX) :]
    if sample not in SAMPLE_TRACES:
        raise UserError(
            f"no sample trace {sample!r}",
            field="--trace",
            fix=f"one of {', '.join(_SAMPLE_PREFIX + k for k in SAMPLE_TRACES)}, or a file",
        )
    return Path(str(resources.files("gpufleet.workload") / "data" / SAMPLE_TRACES[sample]))


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return path.open(newline="")


def _bad_line(path: Path, line_no: int, why: str) -> UserError:
    return UserError(
        f"{path}:{line_no}: {why}",
        field="--trace",
        fix="pass an Azure LLM trace CSV or a Mooncake JSONL trace (see docs/data.md)",
    )


def _nonnegative_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name} must be an integer")
    n = int(value)
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return n


def read_azure_csv(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Azure LLM inference trace: TIMESTAMP (wall clock), ContextTokens, GeneratedTokens."""
    path = trace_path(path)
    out: list[TraceRecord] = []
    t0: tuple[datetime, float] | None = None
    with _open_text(path) as f:
        reader = csv.DictReader(f)
        needed = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if reader.fieldnames is None or not needed <= set(reader.fieldnames):
            raise _bad_line(path, 1, f"header must contain {sorted(needed)}")
        for row in reader:
            if limit is not None and len(out) >= limit:
                break
            line_no = reader.line_num
            try:
                ts = _parse_azure_timestamp(row["TIMESTAMP"])
                inp = _nonnegative_int(row["ContextTokens"], "ContextTokens")
                outp = _nonnegative_int(row["GeneratedTokens"], "GeneratedTokens")
            except (ValueError, TypeError) as e:
                raise _bad_line(path, line_no, str(e)) from None
            if t0 is None:
                t0 = ts
            arrival_s = (ts[0] - t0[0]).total_seconds() + (ts[1] - t0[1])
            out.append(TraceRecord(arrival_s=arrival_s, input_tokens=inp, output_tokens=outp))
    return out


def read_mooncake_jsonl(path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Mooncake trace: timestamp (ms), input_length, output_length, hash_ids (512-token blocks)."""
    path = trace_path(path)
    out: list[TraceRecord] = []
    t0_ms: float | None = None
    with _open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError("each line must be a JSON object")
                ts_ms = float(obj["timestamp"])
                inp = _nonnegative_int(obj["input_length"], "input_length")
                outp = _nonnegative_int(obj["output_length"], "output_length")
                raw_ids = obj.get("hash_ids", [])
                if not isinstance(raw_ids, list):
                    raise ValueError("hash_ids must be a list of integers")
                hash_ids = tuple(_nonnegative_int(h, "hash_ids") for h in raw_ids)
            except KeyError as e:
                raise _bad_line(path, line_no, f"missing field {e}") from None
            except (ValueError, TypeError) as e:
                raise _bad_line(path, line_no, str(e)) from None
            if t0_ms is None:
                t0_ms = ts_ms
            out.append(
                TraceRecord(
                    arrival_s=(ts_ms - t0_ms) / 1000.0,
                    input_tokens=inp,
                    output_tokens=outp,
                    hash_ids=hash_ids,
                )
            )
    return out


def detect_trace_format(path: str | Path) -> str:
    """'azure' or 'mooncake', from the file's first line."""
    path = trace_path(path)
    try:
        with _open_text(path) as f:
            first = f.readline().strip()
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path}: {e}", field="--trace") from None
    if first.startswith("{"):
        return "mooncake"
    if "TIMESTAMP" in first:
        return "azure"
    raise UserError(
        f"{path}: not an Azure CSV (header with TIMESTAMP) nor Mooncake JSONL",
        field="--trace",
        fix="pass a file in one of those formats (see docs/data.md), or sample:mooncake",
    )


def read_trace(path: str | Path, limit: int | None = None, fmt: str = "auto") -> list[TraceRecord]:
    """Read either trace format; `fmt` is 'auto', 'azure' or 'mooncake'."""
    if not trace_path(path).is_file():
        raise UserError(
            f"{path}: no such file", field="--trace", fix="check the path, or use sample:mooncake"
        )
    kind = detect_trace_format(path) if fmt == "auto" else fmt
    if kind == "azure":
        return read_azure_csv(path, limit)
    if kind == "mooncake":
        return read_mooncake_jsonl(path, limit)
    raise UserError(f"unknown trace format {fmt!r}", field="--trace-format", fix="azure|mooncake")


def slice_records(
    records: Sequence[TraceRecord],
    *,
    start_s: float = 0.0,
    duration_s: float | None = None,
    limit: int | None = None,
) -> list[TraceRecord]:
    """The records arriving in [start_s, start_s + duration_s) of trace time (at most
    `limit` of them), shifted so the slice starts at 0."""
    if start_s < 0:
        raise ValueError("start_s must be >= 0")
    end_s = None if duration_s is None else start_s + duration_s
    out: list[TraceRecord] = []
    for rec in records:
        if rec.arrival_s < start_s:
            continue
        if (end_s is not None and rec.arrival_s >= end_s) or (
            limit is not None and len(out) >= limit
        ):
            break
        out.append(dataclasses.replace(rec, arrival_s=rec.arrival_s - start_s))
    return out


def tile_records(records: Sequence[TraceRecord], copies: int) -> list[TraceRecord]:
    """`copies` copies of a trace interleaved: `copies` times its rate over the same span,
    its bursts and lulls kept. Copy k is shifted by k/copies of the mean gap between
    arrivals, and its Mooncake `hash_ids` are its own (copies share no prefix)."""
    if copies < 1:
        raise ValueError("copies must be >= 1")
    if copies == 1 or not records:
        return list(records)
    gap_s = (records[-1].arrival_s - records[0].arrival_s) / max(1, len(records) - 1)
    top = 1 + max((max(r.hash_ids) for r in records if r.hash_ids), default=-1)
    tiled = [
        dataclasses.replace(
            r,
            arrival_s=r.arrival_s + k * gap_s / copies,
            hash_ids=None if r.hash_ids is None else tuple(h + k * top for h in r.hash_ids),
        )
        for k in range(copies)
        for r in records
    ]
    tiled.sort(key=lambda r: r.arrival_s)
    return tiled
