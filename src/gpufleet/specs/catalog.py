"""The catalog of model configs shipped in `data/models/` (named `ORG--NAME.json`) and
`load_model`: a catalog name, a config.json path or a directory holding one."""

from __future__ import annotations

import difflib
import functools
import json
import re
from importlib import resources
from pathlib import Path

from gpufleet.errors import UserError
from gpufleet.specs.config_parse import parse_config
from gpufleet.specs.models import ModelSpec

# Suffixes that name a variant of the same architecture (chat tuning, a quantized copy).
_VARIANT_SUFFIX = re.compile(
    r"(-(instruct|chat|it|base|hf|fp8|fp8-dynamic|awq|gptq|int4|int8|w4a16|w8a8|bf16|v0\.\d+))+$"
)


def _name_keys(name: str) -> set[str]:
    """Every spelling a user might type for a model named `org/Name`."""
    full = name.strip().lower()
    short = full.rsplit("/", 1)[-1]
    keys = {full, short}
    for k in list(keys):
        keys.add(_VARIANT_SUFFIX.sub("", k))
    for k in list(keys):
        if k.rsplit("/", 1)[-1].startswith("meta-"):
            keys.add(k.rsplit("/", 1)[-1].removeprefix("meta-"))
    return keys


@functools.cache
def _catalog_files() -> dict[str, str]:
    """Canonical `org/Name` -> file name."""
    root = resources.files("gpufleet.specs").joinpath("data/models")
    out: dict[str, str] = {}
    for entry in root.iterdir():
        if entry.name.endswith(".json"):
            out[entry.name.removesuffix(".json").replace("--", "/")] = entry.name
    return out


@functools.cache
def _catalog_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for canonical in _catalog_files():
        for key in _name_keys(canonical):
            index.setdefault(key, canonical)
    return index


def model_names() -> list[str]:
    """Canonical names (`org/Name`) of every model config that ships with gpufleet."""
    return sorted(_catalog_files())


@functools.cache
def _load_catalog_model(canonical: str) -> ModelSpec:
    file_name = _catalog_files()[canonical]
    root = resources.files("gpufleet.specs").joinpath("data/models")
    cfg = json.loads(root.joinpath(file_name).read_text())
    return parse_config(cfg, canonical, source=f"catalog config {file_name}")


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name (usual spellings, case-insensitive: `meta-llama/Llama-3.1-70B`,
    `Meta-Llama-3.1-70B`), a path to a config.json, or a directory holding one."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise UserError(
                f"directory {str(path)!r} holds no config.json",
                field="--model",
                fix="point --model at a Hugging Face model directory or its config.json",
            )
        return _load_path(config_path, name=str(path))
    if path.is_file():
        # A model directory's config.json names the directory (what engines load).
        return _load_path(path, name=str(path.parent) if path.name == "config.json" else "")

    index = _catalog_index()
    for key in sorted(_name_keys(name_or_path), key=len, reverse=True):
        if key in index:
            return _load_catalog_model(index[key])
    lowered = name_or_path.strip().lower()
    close = difflib.get_close_matches(lowered, list(index), n=8, cutoff=0.5)
    close_names = sorted({index[c] for c in close})
    hint = f" (close names: {', '.join(close_names)})" if close_names else ""
    raise UserError(
        f"unknown model {name_or_path!r}{hint}",
        field="--model",
        fix=f"use a catalog name ({', '.join(model_names())}), a config.json path, "
        "or a directory holding one",
    )


def _load_path(config_path: Path, name: str) -> ModelSpec:
    try:
        cfg = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(
            f"cannot read {str(config_path)!r}: {e}",
            field="--model",
            fix="pass a valid Hugging Face config.json",
        ) from e
    if not isinstance(cfg, dict):
        raise UserError(
            f"{str(config_path)!r} is not a JSON object",
            field="--model",
            fix="pass a valid Hugging Face config.json",
        )
    # ORG--NAME.json (how the shipped configs are named) reads as the hub id ORG/NAME.
    display = name or str(cfg.get("_name_or_path") or config_path.stem.replace("--", "/"))
    return parse_config(cfg, display, source=str(config_path))
