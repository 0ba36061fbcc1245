"""Every catalog config has its source in data/models/README.md, and the `minimal` ones
hold nothing that `gpufleet.specs` does not read (written for gpufleet, not copied)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpufleet.specs.config_parse import parse_config

MODELS = Path(__file__).parents[2] / "src/gpufleet/specs/data/models"
Path_ = tuple[str | int, ...]


class _Recording(dict[str, Any]):
    """A config whose key reads are logged by path (nested objects too)."""

    def __init__(self, data: dict[str, Any], path: Path_, log: set[Path_]) -> None:
        super().__init__({k: _record(v, (*path, k), log) for k, v in data.items()})
        self._path, self._log = path, log

    def _read(self, key: object) -> None:
        if isinstance(key, str) and dict.__contains__(self, key):
            self._log.add((*self._path, key))

    def get(self, key: str, default: Any = None) -> Any:
        self._read(key)
        return dict.get(self, key, default)

    def __getitem__(self, key: str) -> Any:
        self._read(key)
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        self._read(key)
        return dict.__contains__(self, key)

    def values(self) -> Any:  # iterating reads every key
        for key in dict.keys(self):
            self._read(key)
        return dict.values(self)

    def items(self) -> Any:
        for key in dict.keys(self):
            self._read(key)
        return dict.items(self)


def _record(value: Any, path: Path_, log: set[Path_]) -> Any:
    if isinstance(value, dict):
        return _Recording(value, path, log)
    if isinstance(value, list):
        return [_record(v, (*path, i), log) for i, v in enumerate(value)]
    return value


def _paths(value: Any, path: Path_ = ()) -> set[Path_]:
    """Every key path of a config (list items count as their list)."""
    if not isinstance(value, dict):
        return set()
    out: set[Path_] = set()
    for key, v in value.items():
        out |= {(*path, key)} | _paths(v, (*path, key))
    return out


def unread_keys(cfg: dict[str, Any]) -> list[str]:
    log: set[Path_] = set()
    parse_config(_Recording(cfg, (), log), "x")

    def read(p: Path_) -> bool:
        if any(r[: len(p)] == p for r in log):  # read, or something under it was
            return True
        # under an object read as a whole (nothing below it read one key at a time)
        whole = [r for r in log if not any(len(x) > len(r) and x[: len(r)] == r for x in log)]
        return any(p[: len(r)] == r for r in whole)

    return sorted(".".join(map(str, p)) for p in _paths(cfg) if not read(p))


def _rows() -> dict[str, str]:
    """file -> kind, from the README's table."""
    text = (MODELS / "README.md").read_text()
    return dict(re.findall(r"^\| `([^`]+\.json)` \| (\w+) \|", text, re.MULTILINE))


def test_every_catalog_config_names_its_source() -> None:
    rows = _rows()
    assert set(rows) == {p.name for p in MODELS.glob("*.json")}
    assert set(rows.values()) == {"shared", "minimal"}


@pytest.mark.parametrize("name", sorted(n for n, kind in _rows().items() if kind == "minimal"))
def test_a_minimal_config_holds_only_what_the_parser_reads(name: str) -> None:
    assert unread_keys(json.loads((MODELS / name).read_text())) == []


def test_unread_keys_are_found() -> None:
    """The check can fail: a published config's extra keys are named, nested ones too."""
    cfg = json.loads((MODELS / "moonshotai--Kimi-K2-Instruct.json").read_text())
    cfg["rope_theta"] = 50000.0
    cfg["quantization_config"]["activation_scheme"] = "dynamic"
    assert unread_keys(cfg) == ["quantization_config.activation_scheme", "rope_theta"]


def test_the_vision_config_added_to_a_shared_config_is_minimal() -> None:
    cfg = json.loads((MODELS / "meta-llama--Llama-4-Scout-17B-16E-Instruct.json").read_text())
    assert [k for k in unread_keys(cfg) if k.startswith("vision_config")] == []
    assert cfg["vision_config"]["num_hidden_layers"] > 0


BENCH_CONFIGS = Path(__file__).parents[2] / "benchmarks/data/model_configs"


@pytest.mark.parametrize("path", sorted(BENCH_CONFIGS.glob("*.json")), ids=lambda p: p.name)
def test_the_benchmarks_configs_are_minimal_and_sourced(path: Path) -> None:
    assert f"`{path.name}`" in (BENCH_CONFIGS / "README.md").read_text()
    assert unread_keys(json.loads(path.read_text())) == []
