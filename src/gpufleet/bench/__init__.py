"""gpufleet.bench: a load generator with vLLM's serving-benchmark metric definitions.

report = await run_benchmark(BenchConfig(url="http://127.0.0.1:8000", rate=8))
"""

from gpufleet.bench.config import BenchConfig
from gpufleet.bench.metrics import BenchMetrics, RequestMetrics, request_metrics, summarize
from gpufleet.bench.records import RequestRecord
from gpufleet.bench.report import BenchReport, SweepReport
from gpufleet.bench.runner import build_conversations, run_benchmark
from gpufleet.bench.sweep import find_knee, run_sweep

__all__ = [
    "BenchConfig",
    "BenchMetrics",
    "BenchReport",
    "RequestMetrics",
    "RequestRecord",
    "SweepReport",
    "build_conversations",
    "find_knee",
    "request_metrics",
    "run_benchmark",
    "run_sweep",
    "summarize",
]
