"""YAML config errors point at file:line:col and suggest the close key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import UserError
from gpufleet.fleet.config import load_fleet
from gpufleet.gateway.config import load_config


def error_of(load: object, path: Path, text: str) -> str:
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load(path)  # type: ignore[operator]
    return str(info.value)


def test_misspelt_tenant_key_suggests_the_right_one(tmp_path: Path) -> None:
    msg = error_of(
        load_config,
        tmp_path / "gw.yaml",
        "replicas:\n  - url: http://127.0.0.1:9\ntenants:\n  - name: a\n    api_key: [k1]\n",
    )
    assert msg.startswith(f"{tmp_path / 'gw.yaml'}:5:5: tenants[0].api_key: unknown key")
    assert "did you mean api_keys?" in msg
    assert "Field required" not in msg


def test_wrong_type_points_at_the_value(tmp_path: Path) -> None:
    msg = error_of(load_config, tmp_path / "gw.yaml", "host: 127.0.0.1\nport: abc\n")
    assert msg.startswith(f"{tmp_path / 'gw.yaml'}:2:7: port:")
    assert "integer" in msg


def test_unknown_key_without_a_close_name_lists_the_known_ones(tmp_path: Path) -> None:
    msg = error_of(load_config, tmp_path / "gw.yaml", "queue:\n  zzz: 1\n")
    assert ":2:3: queue.zzz: unknown key" in msg and "max_size" in msg


def test_fleet_file_and_its_gateway_section(tmp_path: Path) -> None:
    msg = error_of(load_fleet, tmp_path / "f.yaml", "autoscale:\n  min_replica: 1\n")
    assert ":2:3: autoscale.min_replica: unknown key" in msg and "min_replicas?" in msg
    msg = error_of(
        load_fleet,
        tmp_path / "f.yaml",
        "gateway:\n  tenants:\n    - name: a\n      api_keys: [k]\n      max_concurent: 3\n",
    )
    assert ":5:7: gateway.tenants[0].max_concurent: unknown key" in msg
    assert "did you mean max_concurrency?" in msg


def test_broken_yaml_gives_line_and_column(tmp_path: Path) -> None:
    msg = error_of(load_config, tmp_path / "gw.yaml", "port: [1\n")
    assert f"{tmp_path / 'gw.yaml'}:2:1: not valid YAML" in msg
