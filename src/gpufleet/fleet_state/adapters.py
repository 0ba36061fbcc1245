"""LoRA adapters across the fleet: which exist (name -> path, base model) and where each is
registered. Pure: the gateway and the simulator do the loading; this keeps the books.

An adapter is known from the fleet config (`adapters:`), or learned from a replica's
`/v1/models`, where vLLM lists each adapter it serves as a card with `parent` = its base
model and `root` = the path it was loaded from (so the gateway can load it elsewhere from
the same path). A request whose `model` names an adapter may go to any replica of the
base model: one that has the adapter registered (in its `models`) serves it at once; on
another the driver first loads it through the engine's dynamic-LoRA API and tells the core
(`FleetState.adapter_registered`). A replica that refuses runtime loading (vLLM without
`VLLM_ALLOW_RUNTIME_LORA_UPDATING` or `--enable-lora`) is marked so and no longer offered
adapters it does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.fleet_state.replica import FleetReplica


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    name: str  # what clients send as `model`
    path: str  # what the engine loads it from (a directory or a hub id)
    base_model: str  # the model whose replicas can serve it


class AdapterCatalog:
    """Adapters by name: the declared ones first; learned ones never replace them."""

    def __init__(self, declared: Iterable[AdapterSpec] = ()) -> None:
        self._by_name: dict[str, AdapterSpec] = {}
        self._declared: set[str] = set()
        for spec in declared:
            self._by_name[spec.name] = spec
            self._declared.add(spec.name)

    def declare(self, spec: AdapterSpec) -> None:
        """Add or replace a configured adapter (a config reload)."""
        self._by_name[spec.name] = spec
        self._declared.add(spec.name)

    def get(self, name: str) -> AdapterSpec | None:
        return self._by_name.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[AdapterSpec]:
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

    def learn(self, cards: Iterable[Mapping[str, Any]]) -> list[AdapterSpec]:
        """Adapters a replica's /v1/models lists (cards with a `parent`); the new ones."""
        new = []
        for card in cards:
            name, parent, root = card.get("id"), card.get("parent"), card.get("root")
            if not (isinstance(name, str) and isinstance(parent, str) and parent):
                continue
            if name in self._declared or name in self._by_name:
                continue
            spec = AdapterSpec(name, root if isinstance(root, str) and root else name, parent)
            self._by_name[name] = spec
            new.append(spec)
        return new

    def card(self, spec: AdapterSpec) -> dict[str, Any]:
        """An OpenAI model card for the adapter, as vLLM lists one."""
        return {
            "id": spec.name,
            "object": "model",
            "created": 0,
            "owned_by": "gpufleet",
            "root": spec.path,
            "parent": spec.base_model,
        }


def can_serve_adapter(replica: FleetReplica, adapter: str) -> bool:
    """Holds the adapter, or may load it (not known to refuse runtime loading)."""
    return adapter in replica.models or replica.lora_loadable is not False
