"""The package layering of docs/design.md, checked on the source (ast; nothing is imported).

Each package of `gpufleet` may import only the packages listed for it below: the lower
layers never reach up, and there are no cycles. A new package must be placed here (the
test fails until it is), so the picture in docs/design.md stays true. The pure packages
(models and policies) must not import clocks, sockets, processes or logging.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpufleet"

_BASE = {"errors"}  # UserError: every layer may raise one
# package -> the packages it may import (besides itself), lowest layers first.
ALLOWED: dict[str, set[str]] = {
    # the bottom: shared definitions with no gpufleet dependency but errors
    "errors": set(),
    "tokenizer": set(),
    "native": _BASE,  # what the modules compiled with mypyc need (tools/compile_sim.py)
    "hash_runs": {"native"},  # runs of consecutive block hashes (the engine's pool, the router)
    "openai_errors": set(),
    "stats": set(),
    "shared_data": _BASE,
    "config_errors": _BASE,  # YAML config errors with file:line:col (every config file)
    "report": _BASE,  # run reports: plots (the plot extra) and HTML from plain records
    "dashboards": set(),  # the Grafana dashboard, built in code and shipped as JSON
    "specs": _BASE,
    # the step-time model and its calibration, below the engine and the planner
    "perf": _BASE | {"specs"},
    "engine": _BASE | {"perf", "tokenizer", "stats", "hash_runs", "native"},
    # the planner's memory math and layout search use specs and perf, never the engine
    "plan": _BASE | {"specs", "perf"},
    "workload": _BASE | {"tokenizer", "stats", "shared_data", "hash_runs"},
    "routing": _BASE | {"tokenizer", "stats", "hash_runs", "native"},
    # the pure fleet core between policies and drivers
    "fleet_state": _BASE | {"routing", "tokenizer", "stats", "openai_errors", "native"},
    # the controller and actuators read the core's GatewaySignals and /metrics reader
    "autoscale": _BASE | {"routing", "fleet_state", "stats"},
    "gateway": _BASE | {"fleet_state", "routing", "autoscale", "tokenizer", "stats",
                        "openai_errors", "config_errors"},
    "replica": _BASE | {"engine", "perf", "plan", "tokenizer", "stats", "openai_errors"},
    "validation": _BASE | {"engine", "plan", "perf", "specs", "stats", "shared_data"},
    "bench": _BASE | {"workload", "stats", "tokenizer", "openai_errors"},
    "sim": _BASE | {"engine", "perf", "plan", "routing", "fleet_state", "autoscale",
                    "workload", "stats", "tokenizer", "specs", "config_errors", "hash_runs"},
    # the top: `gpufleet up` and the command line
    "fleet": _BASE | {"autoscale", "bench", "gateway", "fleet_state", "plan", "replica",
                      "routing", "stats", "workload", "specs", "config_errors", "report"},
    # Kubernetes: manifests from a plan and the in-cluster controller's driver side
    "k8s": _BASE | {"autoscale", "fleet", "fleet_state", "gateway", "plan", "routing", "specs",
                    "config_errors"},
    "cli": _BASE | {"bench", "engine", "fleet", "fleet_state", "gateway", "perf", "plan",
                    "replica", "routing", "autoscale", "sim", "specs", "stats", "validation",
                    "k8s", "workload", "tokenizer", "report", "native"},
    "__init__": set(),
}  # fmt: skip

# Models and policies: state in, decision out. No clock, sleep, socket, process or log.
PURE = ("specs", "perf", "engine", "routing", "workload", "stats", "tokenizer", "errors", "hash_runs",
        "autoscale/policies", "autoscale/signals.py", "autoscale/forecast.py",
        "autoscale/capacity.py", "autoscale/little.py", "autoscale/decision.py", "fleet_state")  # fmt: skip
IMPURE_MODULES = {"time", "asyncio", "socket", "logging", "subprocess", "threading",
                  "multiprocessing", "aiohttp", "signal"}  # fmt: skip


def package_of(path: Path) -> str:
    rel = path.relative_to(SRC).parts
    return rel[0].removesuffix(".py") if len(rel) > 1 or rel[0] != "__init__.py" else "__init__"


def imported_modules(path: Path) -> Iterator[str]:
    """Every module `path` imports, anywhere in it (lazy and TYPE_CHECKING imports too)."""
    here = ["gpufleet", *path.relative_to(SRC).parent.parts]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = here[: len(here) - (node.level - 1)]
                yield ".".join([*base, *([node.module] if node.module else [])])
            else:
                yield node.module or ""


@functools.cache
def package_edges() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the files that import it."""
    edges: dict[str, dict[str, list[str]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        me = package_of(path)
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "gpufleet" and len(parts) > 1 and parts[1] != me:
                files = edges.setdefault(me, {}).setdefault(parts[1], [])
                files.append(str(path.relative_to(SRC)))
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles found by a depth-first search (each as the path that closes it)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_package_is_placed_in_the_layering() -> None:
    packages = {package_of(p) for p in SRC.rglob("*.py")}
    unplaced = packages - set(ALLOWED)
    assert not unplaced, f"place {sorted(unplaced)} in ALLOWED (and in docs/design.md)"


def test_the_stated_layering_has_no_cycle() -> None:
    assert cycles(ALLOWED) == []


def test_no_package_imports_one_it_may_not() -> None:
    upward = [
        f"{me} -> {other} ({', '.join(sorted(set(files)))})"
        for me, targets in package_edges().items()
        for other, files in targets.items()
        if other not in ALLOWED.get(me, set())
    ]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def test_the_code_has_no_import_cycle() -> None:
    actual = {me: set(targets) for me, targets in package_edges().items()}
    assert cycles(actual) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"plan": {"perf"}, "perf": {"specs"}, "engine": {"perf"}}) == []


def pure_files() -> list[Path]:
    out: list[Path] = []
    for name in PURE:
        target = SRC / name
        out += sorted(target.rglob("*.py")) if target.is_dir() else [SRC / f"{name}.py", target]
    return [p for p in out if p.is_file()]


@pytest.mark.parametrize("path", pure_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_pure_packages_use_no_clock_socket_process_or_log(path: Path) -> None:
    impure = {m for m in imported_modules(path) if m.split(".")[0] in IMPURE_MODULES}
    assert not impure, f"{path.relative_to(SRC)} imports {sorted(impure)}"
