"""gpufleet.sim: the discrete-event fleet simulator (see docs/design.md and docs/sim.md).

`Scenario` + `run_scenario` for plain-value runs (the CLI's path); `FleetSimulator` with a
`SimConfig`, policy objects and `SimRequest`s (from `gpufleet.workload`: `sim_requests`
of any workload shapes) for programmatic control; `summarize` for the report.
"""

from gpufleet.sim.config import AutoscaleSpec, SimConfig
from gpufleet.sim.report import summarize
from gpufleet.sim.results import SimResult
from gpufleet.sim.scenario import Scenario, build_requests, run_many, run_scenario
from gpufleet.sim.simulator import FleetSimulator
from gpufleet.workload import SimRequest

__all__ = [
    "AutoscaleSpec",
    "FleetSimulator",
    "Scenario",
    "SimConfig",
    "SimRequest",
    "SimResult",
    "build_requests",
    "run_many",
    "run_scenario",
    "summarize",
]
