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


def _name_keys(name: str) -> dict[str, int]:
    """Every spelling a user might type for a model named `org/Name`, each with its
    distance: 0 for the name itself (or without Meta's `Meta-` prefix), 1 once a variant
    suffix (`-Instruct`, `-FP8`, ...) was dropped to reach it."""
    full = name.strip().lower()
    short = full.rsplit("/", 1)[-1]
    keys = {full: 0, short: 0}
    for k in list(keys):
        stripped = _VARIANT_SUFFIX.sub("", k)
        if stripped != k:
            keys.setdefault(stripped, 1)
    for k, distance in list(keys.items()):
        if k.rsplit("/", 1)[-1].startswith("meta-"):
            keys.setdefault(k.rsplit("/", 1)[-1].removeprefix("meta-"), distance)
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
    """Spelling -> canonical name. A spelling that is a model's own name wins over one that
    only a variant reaches once its suffix is dropped (`Llama-3.1-405B` is the bf16 model,
    not `Llama-3.1-405B-Instruct-FP8`); ties go to the first name in sorted order."""
    best: dict[str, tuple[int, str]] = {}
    for canonical in sorted(_catalog_files()):
        for key, distance in _name_keys(canonical).items():
            if key not in best or distance < best[key][0]:
                best[key] = (distance, canonical)
    return {key: canonical for key, (_, canonical) in best.items()}


@functools.cache
def _catalog_distances() -> dict[str, int]:
    return {
        key: distance
        for canonical in _catalog_files()
        for key, distance in _name_keys(canonical).items()
        if _catalog_index()[key] == canonical
    }


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
    distances = _catalog_distances()
    found = [
        (d + distances[k], -len(k), k) for k, d in _name_keys(name_or_path).items() if k in index
    ]
    if found:  # the fewest dropped suffixes on both sides, then the longest spelling
        return _load_catalog_model(index[min(found)[2]])
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


def _read_object(path: Path) -> dict[str, object]:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(
            f"cannot read {str(path)!r}: {e}",
            field="--model",
            fix="pass a valid Hugging Face config.json",
        ) from e
    if not isinstance(cfg, dict):
        raise UserError(
            f"{str(path)!r} is not a JSON object",
            field="--model",
            fix="pass a valid Hugging Face config.json",
        )
    return cfg


def _quantization_declared(cfg: dict[str, object]) -> bool:
    text = cfg.get("text_config")
    scopes = [cfg, text] if isinstance(text, dict) else [cfg]
    return any(s.get("quantization_config") or s.get("compression_config") for s in scopes)


def _load_path(config_path: Path, name: str) -> ModelSpec:
    cfg = _read_object(config_path)
    # ModelOpt checkpoints (nvidia/*-FP8, *-NVFP4) may state their format only in an
    # hf_quant_config.json beside config.json, which engines read; without it their
    # weights would be planned as bf16 (2-4x the memory).
    sibling = config_path.parent / "hf_quant_config.json"
    if not _quantization_declared(cfg) and sibling.is_file():
        cfg = {**cfg, "quantization_config": {"quant_method": "modelopt", **_read_object(sibling)}}
    # ORG--NAME.json (how the shipped configs are named) reads as the hub id ORG/NAME.
    display = name or str(cfg.get("_name_or_path") or config_path.stem.replace("--", "/"))
    return parse_config(cfg, display, source=str(config_path))
