"""The simulator compiled with mypyc (`make sim-compiled`, tools/compile_sim.py) gives the
interpreted simulator's results bit for bit.

Skipped where the modules are not compiled (a fresh clone, `make test`): compiling takes
minutes. Where they are, each scenario runs here (compiled) and in a child process that
imports gpufleet's modules from their sources only, and every per-request, per-replica and
per-decision field is compared.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpufleet.sim.simulator
from gpufleet.native import is_compiled
from gpufleet.sim.scenario import Scenario, run_scenario_result

COMPILED = is_compiled(gpufleet.sim.simulator)
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not COMPILED, reason="the simulator is not compiled (make sim-compiled)"),
]

SCENARIOS = {
    "prefix_aware": dict(trace="sample:mooncake", num_requests=300, replicas=3,
                         routing="prefix_aware"),
    "sessions": dict(sessions=60, turns=3, rate=20.0, input_tokens=400, output_tokens=80,
                     range_ratio=0.9, replicas=4, routing="power_of_two", seed=1),
    "autoscale_failures": dict(rate=30.0, num_requests=400, input_tokens=300,
                               output_tokens=60, range_ratio=0.5, autoscale="queue_depth",
                               min_replicas=1, max_replicas=4, replicas=1, startup_s=5.0,
                               mtbf_s=20.0, routing="least_outstanding", seed=3),
}  # fmt: skip


def figures(sc: Scenario) -> dict[str, Any]:
    """Every field of a run's results (not its wall or CPU time)."""
    r = run_scenario_result(sc)
    return {"requests": _rows(r.requests), "replicas": _rows(r.replicas),
            "decisions": [repr(d) for d in r.decisions], "end_s": repr(r.end_s),
            "events": r.events}  # fmt: skip


def _rows(items: list[Any]) -> list[str]:
    return [repr([(f.name, getattr(x, f.name)) for f in dataclasses.fields(x)]) for x in items]


def interpreted(name: str) -> dict[str, Any]:
    """`figures` in a child process whose gpufleet modules are all imported from sources."""
    code = f"""
from gpufleet.native import import_sources_only, is_compiled
import_sources_only()
import json, gpufleet.sim.simulator
assert not is_compiled(gpufleet.sim.simulator)
from tests.sim.test_compiled_sim import SCENARIOS, figures, Scenario
print(json.dumps(figures(Scenario(**SCENARIOS[{name!r}]))))
"""
    root = Path(__file__).resolve().parent.parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True, cwd=root)  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_compiled_and_interpreted_simulators_agree(name: str) -> None:
    compiled = json.loads(json.dumps(figures(Scenario(**SCENARIOS[name]))))
    assert compiled["requests"] and compiled == interpreted(name)
