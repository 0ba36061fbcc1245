"""gpufleet.sim: the discrete-event fleet simulator (see DESIGN.md and README `gpufleet sim`).

`Scenario` + `run_scenario` for plain-value runs (the CLI's path); `FleetSimulator` with a
`SimConfig` and policy objects for programmatic control; `summarize` for the report.
"""

from gpufleet.sim.config import AutoscaleSpec, SimConfig
from gpufleet.sim.report import summarize
from gpufleet.sim.results import SimResult
from gpufleet.sim.scenario import Scenario, run_many, run_scenario
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.sim.workload import SimRequest, synthetic_requests, trace_requests

__all__ = [
    "AutoscaleSpec",
    "FleetSimulator",
    "Scenario",
    "SimConfig",
    "SimRequest",
    "SimResult",
    "run_many",
    "run_scenario",
    "summarize",
    "synthetic_requests",
    "trace_requests",
]
