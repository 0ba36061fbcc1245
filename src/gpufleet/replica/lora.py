"""LoRA adapters on the simulated replica, as vLLM serves them.

- `--enable-lora --max-loras N --max-lora-rank R --max-cpu-loras M` size the engine's
  adapter slots (`gpufleet.engine.lora`); `--lora-modules name=path` (or vLLM's JSON form
  `{"name", "path", "base_model_name"}`) registers adapters at start.
- With `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` in the environment (vLLM reads it as a
  boolean: `1` or `true`), `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and
  `POST /v1/unload_lora_adapter {"lora_name"}` change them at runtime, with vLLM's answers
  (200 and a text line; 400 "has already been loaded"; 404 "No adapter found" /
  "cannot be found"). A load holds the engine for the adapter's load time, between
  iterations, and answers when it is done.
- A request names an adapter as its `model`; `/v1/models` lists each adapter as a card with
  `root` = its path and `parent` = the base model.

No weights exist: an adapter's rank comes from `adapter_config.json` (PEFT's `r`) when its
path is a local directory that has one; a path that looks local (`/`, `./`, `~`) but does
not exist is "No adapter found"; anything else is a hub id whose rank is taken to be
`--max-lora-rank`.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from gpufleet.engine.lora import LoraAdapter
from gpufleet.errors import UserError
from gpufleet.replica.errors import RequestError

RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
NOT_ENABLED = "LoRA is not enabled. Use --enable-lora to enable LoRA."


def runtime_updates_allowed(environ: dict[str, str] | None = None) -> bool:
    """vLLM's reading of VLLM_ALLOW_RUNTIME_LORA_UPDATING."""
    value = (environ if environ is not None else os.environ).get(RUNTIME_UPDATES_ENV, "0")
    return value.strip().lower() in ("1", "true")


@dataclass(frozen=True, slots=True)
class LoraModule:
    """One `--lora-modules` entry."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: tuple[str, ...] | list[str]) -> list[LoraModule]:
    """`name=path` or `{"name": ..., "path": ..., "base_model_name": ...}` (vLLM's forms)."""
    out: list[LoraModule] = []
    for value in values:
        text = value.strip()
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except ValueError as e:
                raise UserError(f"bad JSON {value!r}: {e}", field="--lora-modules") from None
            if not isinstance(data, dict) or not data.get("name") or not data.get("path"):
                raise UserError(f"{value!r} needs a name and a path", field="--lora-modules",
                                fix='{"name": "sql", "path": "/adapters/sql"}')  # fmt: skip
            base = data.get("base_model_name")
            out.append(LoraModule(str(data["name"]), str(data["path"]), base and str(base)))
            continue
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise UserError(f"bad item {value!r}", field="--lora-modules",
                            fix="name=path, e.g. sql-lora=/adapters/sql")  # fmt: skip
        out.append(LoraModule(name.strip(), path.strip()))
    names = [m.name for m in out]
    if len(names) != len(set(names)):
        raise UserError("two adapters share a name", field="--lora-modules")
    return out


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~"))


def adapter_from_path(name: str, path: str, default_rank: int) -> LoraAdapter:
    """The adapter at `path` (its rank from adapter_config.json); RequestError 404 when a
    local path has no adapter."""
    local = Path(path).expanduser()
    if local.is_dir():
        config = local / "adapter_config.json"
        try:
            rank = int(json.loads(config.read_text()).get("r", default_rank))
        except (OSError, ValueError, AttributeError, TypeError):
            raise RequestError(
                f"Loading lora {name} failed: No adapter found for {path}", status=404
            ) from None
        return LoraAdapter(name, path, rank)
    if _looks_local(path):
        raise RequestError(f"Loading lora {name} failed: No adapter found for {path}", status=404)
    return LoraAdapter(name, path, default_rank)  # a hub id: nothing to read here


def adapter_cards(
    adapters: list[LoraAdapter], base_models: dict[str, str], default_base: str, created: int
) -> list[dict[str, Any]]:
    """vLLM's model cards of adapters: root = where it was loaded from, parent = its base."""
    return [
        {
            "id": a.name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": a.path,
            "parent": base_models.get(a.name, default_base),
            "max_model_len": None,
            "permission": [],
        }
        for a in adapters
    ]


LoraInfo = Callable[[], tuple[dict[str, int], dict[str, int], int]]
_LABEL_HISTORY = 32  # vLLM keeps every label set ever seen; this keeps the last few


class LoraRequestsGauge:
    """vllm:lora_requests_info as vLLM exposes it: one line per label set seen, the value
    the wall time it was last current (the line with the largest value is the state now)."""

    def __init__(self, info: LoraInfo, clock: Callable[[], float] = time.time) -> None:
        self._info = info
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def collect(self) -> GaugeMetricFamily:
        running, waiting, max_lora = self._info()
        key = (str(max_lora), ",".join(running), ",".join(waiting))
        self._seen[key] = self._clock()
        self._seen.move_to_end(key)
        while len(self._seen) > _LABEL_HISTORY:
            self._seen.popitem(last=False)
        gauge = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        for labels, value in self._seen.items():
            gauge.add_metric(list(labels), value)
        return gauge
