"""What the modules tools/compile_sim.py compiles with mypyc (`make sim-compiled`) need.

`mypyc_attr` without mypy_extensions at run time (a dev dependency): where it is absent the
decorator does nothing, as mypy_extensions' own does when a module runs interpreted.
`stale_compiled_modules` finds compiled modules an edit has left behind.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from gpufleet.errors import UserError

_T = TypeVar("_T")

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # pragma: no cover - only without the dev extra

        def mypyc_attr(*attrs: str, **kwattrs: Any) -> Callable[[_T], _T]:
            return lambda x: x


COMPILED_STAMP = "_compiled_sources.json"  # written by tools/compile_sim.py beside the .so


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale_compiled_modules(package: Path | None = None) -> list[str]:
    """gpufleet's compiled modules (tools/compile_sim.py) whose sources changed since they
    were compiled: Python imports a module's .so before its .py, so an edit would not run
    until recompiled. (Content digests: a checkout or a no-op build moves mtimes.)
    `package` is the gpufleet package directory, this one unless given."""
    package = package or Path(__file__).resolve().parent
    if not any(package.rglob("*.so")):
        return []
    stamp = package / COMPILED_STAMP
    if not stamp.exists():
        return ["(no record of the compiled sources: " + COMPILED_STAMP + ")"]
    digests: dict[str, str] = json.loads(stamp.read_text())
    return sorted(
        name
        for name, digest in digests.items()
        if not (package.parent / name).exists() or source_digest(package.parent / name) != digest
    )


def refuse_stale_compiled(package: Path | None = None) -> None:
    """Stop with a clear error where compiled modules are older than their sources (the
    `gpufleet` command and pytest call it first): running them would run the old code."""
    stale = stale_compiled_modules(package)
    if stale:
        shown = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        raise UserError(
            f"compiled modules are older than their sources ({shown}): run "
            "`make sim-compiled` again, or `python tools/compile_sim.py --clean` for the "
            "interpreted ones"
        )


def is_compiled(module: ModuleType) -> bool:
    """Whether `module` runs compiled (a .so from tools/compile_sim.py): tests that patch or
    spy on its functions and classes cannot there (compiled code calls them directly)."""
    return not str(getattr(module, "__file__", "")).endswith(".py")


def import_sources_only() -> None:
    """From now on import gpufleet's modules from their sources, compiled or not: what a
    benchmark or a test compares the compiled modules with, in one process. Call it before
    any compiled module is imported (`gpufleet.native` itself is never compiled)."""
    package = str(Path(__file__).resolve().parent)

    def sources_only(path: str) -> importlib.machinery.FileFinder:
        if not path.startswith(package):
            raise ImportError(path)  # (not ours: the next hook finds it)
        loaders = (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)
        return importlib.machinery.FileFinder(path, loaders)

    sys.path_hooks.insert(0, sources_only)
    sys.path_importer_cache.clear()
