"""The few fitted constants of the step-time model, and the script that fits them.

Constants are physical (efficiencies as fractions of a roofline, overheads in seconds) and
few, so the model carries over to models and GPUs it was not fitted on. They live in
`data/calibration.yaml`; `python -m gpufleet.plan.calibration [CSV]` refits them on a
measured-serving CSV (default: ../shared/validation/measured_serving_dev.csv) by a
coordinate search minimising the median absolute log-errors of TTFT and TPOT, each
scaled by its accuracy target.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml


@dataclass(frozen=True)
class BackendCalibration:
    """What differs between serving engines running the same kernels.

    step_overhead_s: fixed CPU + launch time per iteration (scheduler, sampling, graphs).
    ttft_overhead_s: per-request time outside the GPU before the first token (HTTP,
        tokenization, detokenization, streaming).
    mixed_prefill: prefill chunks share iterations with decodes (vLLM, TRT-LLM) or run as
        iterations of their own (SGLang).
    max_num_batched_tokens: default token budget per iteration on 80+ GB GPUs.
    moe_efficiency: the backend's fused-MoE kernels' achieved HBM bandwidth relative to its
        dense GEMMs when reading expert weights (decode: bandwidth-bound).
    moe_gemm_efficiency: the same kernels' achieved tensor FLOP/s relative to its dense GEMMs
        when compute-bound (prefill: every expert sees many tokens). Grouped GEMMs over many
        small experts with block-scaled fp8 reach far less than a dense GEMM in some engines.
    benchmark_requests_per_client: the measured benchmarks ran a finite number of
        requests per client, all clients starting at once; the first wave's queueing
        weighs 1/this in their mean TTFT (a property of each backend's benchmark harness,
        used only when predicting measured rows, never by the planner).
    """

    step_overhead_s: float = 0.003
    ttft_overhead_s: float = 0.02
    moe_efficiency: float = 1.0
    moe_gemm_efficiency: float = 1.0
    benchmark_requests_per_client: float = 8.0
    mixed_prefill: bool = True
    max_num_batched_tokens: int = 8192


@dataclass(frozen=True)
class Calibration:
    gemm_efficiency: float = 0.7  # achieved / peak dense tensor FLOP/s for GEMMs
    attention_efficiency: float = 0.5  # achieved / peak FLOP/s for attention kernels
    memory_efficiency: float = 0.85  # achieved / peak HBM bandwidth
    allreduce_latency_s: float = 10e-6  # one small all-reduce (custom one-shot kernels)
    queue_scale: float = 1.0  # prefill queueing relative to an exponential-service queue
    backends: Mapping[str, BackendCalibration] = field(
        default_factory=lambda: MappingProxyType({"default": BackendCalibration()})
    )

    def backend(self, name: str | None) -> BackendCalibration:
        if name and name.lower() in self.backends:
            return self.backends[name.lower()]
        return self.backends.get("default", BackendCalibration())


_SCALARS = ("gemm_efficiency", "attention_efficiency", "memory_efficiency",
            "allreduce_latency_s", "queue_scale")  # fmt: skip


def calibration_from_dict(raw: Mapping[str, Any]) -> Calibration:
    backends = {
        str(name).lower(): BackendCalibration(**dict(values))
        for name, values in (raw.get("backends") or {}).items()
    }
    backends.setdefault("default", BackendCalibration())
    scalars = {k: float(raw[k]) for k in _SCALARS if k in raw}
    return Calibration(**scalars, backends=MappingProxyType(backends))


def calibration_to_dict(cal: Calibration) -> dict[str, Any]:
    out: dict[str, Any] = {k: round(float(getattr(cal, k)), 9) for k in _SCALARS}
    out["backends"] = {
        name: {
            k: (round(v, 9) if isinstance(v, float) else v)
            for k, v in dataclasses.asdict(b).items()
        }
        for name, b in sorted(cal.backends.items())
    }
    return out


@functools.cache
def default_calibration() -> Calibration:
    """The shipped constants (`data/calibration.yaml`)."""
    text = resources.files("gpufleet.plan").joinpath("data/calibration.yaml").read_text()
    return calibration_from_dict(yaml.safe_load(text) or {})


# ---- fitting ------------------------------------------------------------------------


def _score(cal: Calibration, rows: Sequence[Any]) -> float:
    """The acceptance metrics themselves: median |log(predicted / measured)| of TTFT and of
    TPOT, each scaled by its target (20% and 10%), summed. Medians keep the fit robust to
    the few rows no engine-level model explains."""
    from gpufleet.plan.perf_validation import predict_row

    ttft: list[float] = []
    tpot: list[float] = []
    for row in rows:
        pred = predict_row(row, cal)
        if pred is None:
            continue
        ttft.append(abs(math.log(pred.ttft_s / row.ttft_s)))
        tpot.append(abs(math.log(pred.tpot_s / row.tpot_s)))
    if not ttft:
        return math.inf
    return statistics.median(ttft) / 0.2 + statistics.median(tpot) / 0.1


_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.2, 0.95),
    "attention_efficiency": (0.1, 0.95),
    "memory_efficiency": (0.4, 0.95),
    "allreduce_latency_s": (2e-6, 40e-6),
    "queue_scale": (0.05, 4.0),
    "benchmark_requests_per_client": (1.0, 50.0),
    "step_overhead_s": (0.0, 0.02),
    "ttft_overhead_s": (0.0, 0.3),
    "moe_efficiency": (0.1, 1.5),
    "moe_gemm_efficiency": (0.02, 1.0),  # no faster than dense GEMMs
}


def _replace(cal: Calibration, key: str, value: float, backend: str | None) -> Calibration:
    changes: dict[str, Any] = {key: value}
    if backend is None:
        return dataclasses.replace(cal, **changes)
    backends = dict(cal.backends)
    backends[backend] = dataclasses.replace(cal.backend(backend), **changes)
    return dataclasses.replace(cal, backends=MappingProxyType(backends))


def fit(rows: Sequence[Any], start: Calibration, rounds: int = 3) -> Calibration:
    """Coordinate search: each constant in turn, multiplicative steps that shrink."""
    cal = start
    best = _score(cal, rows)
    knobs: list[tuple[str, str | None]] = [(k, None) for k in _SCALARS]
    backends = sorted({r.backend for r in rows} & set(cal.backends))
    for b in backends:
        knobs += [("step_overhead_s", b), ("ttft_overhead_s", b), ("moe_efficiency", b)]
        knobs += [("moe_gemm_efficiency", b)]
        knobs += [("benchmark_requests_per_client", b)]
    for step in [1.5, 1.2, 1.07][:rounds]:
        for key, backend in knobs:
            improved = True
            while improved:
                improved = False
                owner: Any = cal if backend is None else cal.backend(backend)
                current = float(getattr(owner, key))
                lo, hi = _BOUNDS[key]
                seed = current if current > 0 else hi * 0.05
                for raw in (seed * step, seed / step):
                    cand = min(hi, max(lo, raw))
                    if cand == current:
                        continue
                    trial = _replace(cal, key, cand, backend)
                    s = _score(trial, rows)
                    if s < best - 1e-6:
                        cal, best, improved = trial, s, True
                        break
    return cal


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from gpufleet.plan.perf_validation import DEFAULT_CSV, read_rows

    parser = argparse.ArgumentParser(description="Refit the step-time model's constants.")
    parser.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "data" / "calibration.yaml",
        help="where to write the constants (default: the shipped calibration.yaml)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="coordinate-search rounds (1-3)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    rows = read_rows(args.csv)
    cal = fit(rows, default_calibration(), rounds=args.rounds)
    header = (
        "# Fitted by `python -m gpufleet.plan.calibration` on "
        f"{args.csv.name} ({len(rows)} rows). Few, physical constants: see calibration.py.\n"
    )
    args.out.write_text(header + yaml.safe_dump(calibration_to_dict(cal), sort_keys=False))
    print(f"wrote {args.out}: score {_score(cal, rows):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
