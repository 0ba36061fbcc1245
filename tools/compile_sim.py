"""Compile the simulator's hot path with mypyc, in place (opt-in: `make sim-compiled`).

    python tools/compile_sim.py           # build .so files next to the .py files in src/gpufleet
    python tools/compile_sim.py --clean   # remove them (the interpreted modules come back)

The modules below are every module whose code runs per event or per request in a
`FleetSimulator.run()` (cProfile of the sim_speed cases) plus those defining the objects
they touch, so that the requests, the event loop, routing and fleet state are native
classes together (a compiled module working on interpreted objects gains nothing).
Results are bit-identical to the interpreted modules (docs/sim.md "How fast it runs").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))  # (the helpers below need only the standard library)
from gpufleet.native import COMPILED_STAMP, source_digest  # noqa: E402

MODULES = [
    "gpufleet/hash_runs.py",
    "gpufleet/tokenizer.py",
    "gpufleet/engine/block_pool.py",
    "gpufleet/engine/block_runs.py",
    "gpufleet/engine/decode_apply.py",
    "gpufleet/engine/decode_run.py",
    "gpufleet/engine/driver.py",
    "gpufleet/engine/engine.py",
    "gpufleet/engine/kv_cache_manager.py",
    "gpufleet/engine/outputs.py",
    "gpufleet/engine/request.py",
    "gpufleet/engine/scheduler.py",
    "gpufleet/fleet_state/arrivals.py",
    "gpufleet/fleet_state/engine_metrics.py",
    "gpufleet/fleet_state/latency.py",
    "gpufleet/fleet_state/queue.py",
    "gpufleet/fleet_state/recent_times.py",
    "gpufleet/fleet_state/replica.py",
    "gpufleet/fleet_state/state.py",
    "gpufleet/fleet_state/table.py",
    "gpufleet/perf/decode_run.py",
    "gpufleet/perf/roofline.py",
    "gpufleet/perf/step_batch.py",
    "gpufleet/perf/step_ends.py",
    "gpufleet/routing/base.py",
    "gpufleet/routing/load.py",
    "gpufleet/routing/prefix.py",
    "gpufleet/routing/prefix_aware.py",
    "gpufleet/routing/prefix_index.py",
    "gpufleet/routing/prefix_uses.py",
    "gpufleet/routing/simple.py",
    "gpufleet/routing/slow_start.py",
    "gpufleet/routing/types.py",
    "gpufleet/sim/clients.py",
    "gpufleet/sim/events.py",
    "gpufleet/sim/fleet.py",
    "gpufleet/sim/gateway.py",
    "gpufleet/sim/replica.py",
    "gpufleet/sim/results.py",
    "gpufleet/sim/simulator.py",
    "gpufleet/workload/render.py",
    "gpufleet/workload/segments.py",
]


def built() -> list[Path]:
    """The compiled files in src/: one .so per module, mypyc's shared library, the record
    of the sources compiled."""
    stamp = SRC / "gpufleet" / COMPILED_STAMP
    return [p for p in SRC.rglob("*.so") if p.is_file()] + ([stamp] if stamp.exists() else [])


def clean() -> None:
    for p in built():
        p.unlink()
        print(f"removed {p.relative_to(ROOT)}")


def record_sources() -> None:
    """What was compiled, by content (`gpufleet.native.stale_compiled_modules` checks it)."""
    digests = {m: source_digest(SRC / m) for m in MODULES}
    (SRC / "gpufleet" / COMPILED_STAMP).write_text(json.dumps(digests, indent=1) + "\n")


def build(opt_level: str) -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    build_dir = ROOT / "build" / "mypyc"
    os.chdir(SRC)  # module paths relative to the package root, so names are gpufleet.*
    ext = mypycify(MODULES, opt_level=opt_level, target_dir=str(build_dir))
    setup(
        name="gpufleet-compiled-sim",
        ext_modules=ext,
        script_args=[
            "build_ext",
            "--inplace",
            "--build-temp",
            str(build_dir / "temp"),
            "--build-lib",
            str(build_dir / "lib"),
        ],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--opt-level", default="3", help="C compiler optimisation level")
    args = parser.parse_args()
    if args.clean:
        clean()
        return 0
    build(args.opt_level)
    record_sources()
    return 0


if __name__ == "__main__":
    sys.exit(main())
