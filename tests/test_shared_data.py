"""The optional full data sets are found through one setting (`SHARED_ENV`). Every test here
points it at its own temporary folder: nothing outside the repository is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import UserError
from gpufleet.shared_data import SHARED_ENV, shared_dir, shared_file
from gpufleet.validation.measured import default_csv


def test_the_setting_names_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.jsonl").write_text("{}\n")
    monkeypatch.setenv(SHARED_ENV, str(tmp_path))
    assert shared_dir() == tmp_path
    assert shared_file("traces", "t.jsonl") == tmp_path / "traces" / "t.jsonl"


def test_a_missing_file_is_an_error_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SHARED_ENV, str(tmp_path))
    with pytest.raises(UserError) as e:
        shared_file("traces", "absent_trace.jsonl")
    assert e.value.field == SHARED_ENV and str(tmp_path) in str(e.value)
    with pytest.raises(UserError, match=SHARED_ENV):
        default_csv()  # the planner's accuracy benchmark's default input
