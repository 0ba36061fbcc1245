"""Compiled modules older than their sources are found and refused (gpufleet.native), on a
package tree of its own: a stand-in .so file is enough, since only its presence and the
record of what was compiled are read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import gpufleet.cli
import gpufleet.native
from gpufleet.errors import UserError
from gpufleet.native import (
    COMPILED_STAMP,
    refuse_stale_compiled,
    source_digest,
    stale_compiled_modules,
)


def _compiled_tree(root: Path) -> Path:
    package = root / "gpufleet"
    (package / "engine").mkdir(parents=True)
    for name in ("engine/a.py", "b.py"):
        (package / name).write_text("X = 1\n")
    (package / "engine" / "a.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    record = {f"gpufleet/{n}": source_digest(package / n) for n in ("engine/a.py", "b.py")}
    (package / COMPILED_STAMP).write_text(json.dumps(record))
    return package


def test_nothing_is_stale_without_compiled_modules(tmp_path: Path) -> None:
    (tmp_path / "gpufleet").mkdir()
    (tmp_path / "gpufleet" / "a.py").write_text("X = 1\n")
    assert stale_compiled_modules(tmp_path / "gpufleet") == []


def test_an_edited_source_is_stale_and_refused(tmp_path: Path) -> None:
    package = _compiled_tree(tmp_path)
    assert stale_compiled_modules(package) == []
    refuse_stale_compiled(package)  # nothing to refuse
    (package / "engine" / "a.py").write_text("X = 2\n")
    (package / "b.py").unlink()
    assert stale_compiled_modules(package) == ["gpufleet/b.py", "gpufleet/engine/a.py"]
    with pytest.raises(UserError, match="make sim-compiled"):
        refuse_stale_compiled(package)


def test_compiled_modules_without_their_record_are_stale(tmp_path: Path) -> None:
    package = _compiled_tree(tmp_path)
    (package / COMPILED_STAMP).unlink()
    assert stale_compiled_modules(package) == [
        f"(no record of the compiled sources: {COMPILED_STAMP})"
    ]


def test_the_command_refuses_stale_compiled_modules(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        gpufleet.native, "stale_compiled_modules", lambda package=None: ["gpufleet/sim/fleet.py"]
    )
    monkeypatch.setattr(sys, "argv", ["gpufleet", "plan", "--help"])
    with pytest.raises(SystemExit) as stop:
        gpufleet.cli.main()
    assert stop.value.code == 2
    assert "gpufleet/sim/fleet.py" in capsys.readouterr().err
