"""`gpufleet sim --sweep … --ray-address ADDR`: one scenario per Ray task, one table back.

The same `run_scenario` the local process pool runs, as a Ray task of one CPU each; the
summaries come back in the order given, so the table matches the local one for the same
seeds (the simulator is deterministic; only its wall-clock fields differ). A trace file
must be readable at the same path on every node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpufleet.autoscale.raycluster import require_ray
from gpufleet.errors import UserError
from gpufleet.sim.scenario import Scenario, run_scenario


def run_many_on_ray(
    scenarios: Sequence[Scenario], address: str, *, namespace: str = "gpufleet"
) -> list[dict[str, Any]]:
    ray = require_ray(field="--ray-address")
    connected_here = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        except ConnectionError as e:
            raise UserError(
                f"cannot reach a Ray cluster at {address!r}: {e}",
                field="--ray-address",
                fix="start one (`ray start --head`) or drop --ray-address to use local processes",
            ) from None
        connected_here = True
    try:
        task = ray.remote(num_cpus=1)(run_scenario)
        summaries: list[dict[str, Any]] = ray.get([task.remote(sc) for sc in scenarios])
        return summaries
    finally:
        if connected_here:
            ray.shutdown()
