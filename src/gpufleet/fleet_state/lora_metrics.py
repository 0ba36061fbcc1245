"""vLLM's `vllm:lora_requests_info`: which adapters a replica is running and queueing.

vLLM sets this gauge every iteration with three labels, `running_lora_adapters` and
`waiting_lora_adapters` (comma-separated adapter names) and `max_lora` (its `--max-loras`),
and the current time as the value. prometheus_client keeps every label set it was ever
given, so /metrics shows one line per combination seen: the current one is the line with
the largest value (the Gateway API Inference Extension's endpoint picker reads it the same
way). The gauge exists only when the server runs with `--enable-lora`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

LORA_REQUESTS_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True, slots=True)
class LoraRequestsInfo:
    running: tuple[str, ...] = ()  # adapters with requests in the running batch
    waiting: tuple[str, ...] = ()  # adapters with requests waiting
    max_lora: int | None = None  # adapters one batch may use; None: not reported


def _names(label: str | None) -> tuple[str, ...]:
    return tuple(n for n in (part.strip() for part in (label or "").split(",")) if n)


def lora_requests_info(
    samples: Iterable[tuple[str, dict[str, str], float]],
) -> LoraRequestsInfo | None:
    """The latest `vllm:lora_requests_info` line of a scrape's samples; None without one."""
    latest: tuple[float, dict[str, str]] | None = None
    for name, labels, value in samples:
        if name == LORA_REQUESTS_INFO and (latest is None or value >= latest[0]):
            latest = (value, labels)
    if latest is None:
        return None
    labels = latest[1]
    try:
        max_lora: int | None = int(labels.get("max_lora", ""))
    except ValueError:
        max_lora = None
    return LoraRequestsInfo(
        running=_names(labels.get("running_lora_adapters")),
        waiting=_names(labels.get("waiting_lora_adapters")),
        max_lora=max_lora,
    )
