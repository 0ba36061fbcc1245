"""Which engine a replica runs, from what it answers: pure functions over parsed answers.

In order of trust: its `/metrics` names (they are what the fleet reads anyway), the
`owned_by` of its `/v1/models` cards (vLLM "vllm", SGLang "sglang", TensorRT-LLM
"tensorrt_llm"), TGI's `/info` (`router: text-generation-router`), SGLang's
`/get_server_info`, and a bare `/version` (vLLM's; trtllm-serve answers one too, so it
is the weakest). The gateway asks the HTTP endpoints only when the metrics do not say,
and only to tell a person why a replica is routed by in-flight counts alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.fleet_state.engine_metrics import ScrapedMetrics

OWNED_BY_ENGINE = {"vllm": "vllm", "sglang": "sglang", "tensorrt_llm": "trtllm"}


@dataclass(frozen=True, slots=True)
class EngineIdentity:
    engine: str | None  # vllm | sglang | tgi | trtllm; None: unknown
    source: str  # what said so: "config", "/metrics names", "/v1/models", "/info", ...
    version: str | None = None

    def describe(self) -> str:
        if self.engine is None:
            return "engine unknown"
        version = f" {self.version}" if self.version else ""
        return f"{self.engine}{version}, from {self.source}"


UNKNOWN = EngineIdentity(None, "")


def from_metrics(scraped: ScrapedMetrics) -> EngineIdentity:
    return EngineIdentity(scraped.engine, "/metrics names") if scraped.engine else UNKNOWN


def from_model_cards(cards: Iterable[Mapping[str, Any]]) -> EngineIdentity:
    for card in cards:
        engine = OWNED_BY_ENGINE.get(str(card.get("owned_by", "")))
        if engine is not None:
            return EngineIdentity(engine, "/v1/models owned_by")
    return UNKNOWN


def from_info(info: object) -> EngineIdentity:
    """TGI's GET /info."""
    if isinstance(info, Mapping) and (
        info.get("router") == "text-generation-router"
        or ("model_id" in info and "max_total_tokens" in info)
    ):
        return EngineIdentity("tgi", "/info", _str(info.get("version")))
    return UNKNOWN


def from_server_info(info: object) -> EngineIdentity:
    """SGLang's GET /get_server_info: its server args plus scheduler info and version."""
    keys = ("tp_size", "max_total_num_tokens", "schedule_policy", "mem_fraction_static")
    if isinstance(info, Mapping) and "version" in info and any(k in info for k in keys):
        return EngineIdentity("sglang", "/get_server_info", _str(info.get("version")))
    return UNKNOWN


def from_version(body: object) -> EngineIdentity:
    """A bare {"version": ...} (vLLM's GET /version)."""
    if isinstance(body, Mapping) and isinstance(body.get("version"), str):
        return EngineIdentity("vllm", "/version", body["version"])
    return UNKNOWN


def identify(
    scraped: ScrapedMetrics | None = None,
    *,
    cards: Iterable[Mapping[str, Any]] = (),
    info: object = None,
    server_info: object = None,
    version: object = None,
) -> EngineIdentity:
    """The most trusted answer among those given."""
    for found in (
        from_metrics(scraped) if scraped is not None else UNKNOWN,
        from_model_cards(cards),
        from_info(info),
        from_server_info(server_info),
        from_version(version),
    ):
        if found.engine is not None:
            return found
    return UNKNOWN


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
