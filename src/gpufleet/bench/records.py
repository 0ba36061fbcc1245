"""What the client saw of one request: send time, token-chunk arrival times, usage, errors.

Everything the metrics need is here, so metrics are computed from recorded timelines with
no network and no clock (see `metrics.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """The client-side timeline of one request. Times are `time.perf_counter()` seconds.

    `token_times_s` holds the arrival time of every stream event whose `choices` list is
    non-empty (vLLM's rule: such an event counts even when its text is empty; the final
    usage-only event does not). `ok` is False for any failure, with `error_type` saying
    which kind (HTTP status class, timeout, malformed chunk, ...).
    """

    conversation_id: int = 0
    turn: int = 0
    scheduled_s: float = 0.0  # when the arrival process released it (before any concurrency cap)
    start_s: float = 0.0  # when it was sent
    prompt_tokens: int = 0  # as built; replaced by the server's usage.prompt_tokens when given
    max_tokens: int = 0
    token_times_s: list[float] = field(default_factory=list)
    usage_completion_tokens: int | None = None
    text: str = ""
    ok: bool = False
    status: int | None = None
    error_type: str = ""
    error: str = ""
