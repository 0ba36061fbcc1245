"""vLLM's SamplingParams checks, same rules and messages: the simulated model's words do not
depend on these knobs, but a client mistake still gets vLLM's 400 naming the field."""

from __future__ import annotations

from gpufleet.replica.errors import RequestError
from gpufleet.replica.requests import ChatCompletionRequest, CompletionRequest


def _range(name: str, value: float | None, ok: bool, rule: str) -> None:
    if value is not None and not ok:
        raise RequestError(f"{name} must be {rule}, got {value}.", param=name)


def check_sampling(
    r: CompletionRequest | ChatCompletionRequest, vocab: int, max_logprobs: int, max_n: int
) -> None:
    """vLLM's SamplingParams checks (same rules, same messages)."""
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(r, name)
        _range(name, v, v is None or -2.0 <= v <= 2.0, "in [-2, 2]")
    v = r.repetition_penalty
    _range("repetition_penalty", v, v is None or v > 0, "greater than zero")
    _range(
        "temperature", r.temperature, r.temperature is None or r.temperature >= 0, "non-negative"
    )
    _range("top_p", r.top_p, r.top_p is None or 0 < r.top_p <= 1, "in (0, 1]")
    _range("top_k", r.top_k, r.top_k is None or r.top_k >= -1, "-1, 0 (disable), or at least 1")
    _range("min_p", r.min_p, r.min_p is None or 0 <= r.min_p <= 1, "in [0, 1]")
    _range("min_tokens", r.min_tokens, r.min_tokens >= 0, "greater than or equal to 0")
    if r.n is not None and r.n < 1:
        raise RequestError(f"n must be at least 1, got {r.n}.", param="n")
    if r.n is not None and r.n > max_n:
        raise RequestError(f"n must be at most {max_n}, got {r.n}.", param="n")
    if r.use_beam_search:
        raise RequestError(
            "beam search is not simulated by gpufleet replica; drop use_beam_search",
            param="use_beam_search",
        )
    for name in ("logit_bias",):
        bias = r.logit_bias or {}
        bad = [k for k in bias if not k.lstrip("-").isdigit() or not 0 <= int(k) < vocab]
        if bad:
            raise RequestError(
                f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids. "
                f"Vocabulary size: {vocab}",
                param=name,
            )
    for name in ("allowed_token_ids", "stop_token_ids"):
        ids = getattr(r, name)
        if ids is not None and any(t >= vocab for t in ids):
            raise RequestError(f"{name} contains out-of-vocab token id!", param=name)
    if r.allowed_token_ids == []:
        raise RequestError("allowed_token_ids is not None and empty!", param="allowed_token_ids")
    if r.priority != 0:
        raise RequestError(
            f"Got priority {r.priority} but Priority scheduling is not enabled.", param="priority"
        )
    if r.logits_processors:
        raise RequestError(
            "The `logits_processors` argument is not supported by this server.",
            param="logits_processors",
        )
    if r.mm_processor_kwargs:
        raise RequestError("the simulated model is text-only", param="mm_processor_kwargs")
    for name, n in (("logprobs", asked_logprobs(r)), ("prompt_logprobs", r.prompt_logprobs)):
        if n is not None and (n == -1 or n > max_logprobs):
            asked = vocab if n == -1 else n
            kind = "sample" if name == "logprobs" else "prompt"
            field = "top_logprobs" if isinstance(r, ChatCompletionRequest) else name
            raise RequestError(
                f"{field}: Requested {kind} logprobs of {asked}, which is greater than max "
                f"allowed: {max_logprobs}",
                param=field,
            )


def asked_logprobs(r: CompletionRequest | ChatCompletionRequest) -> int | None:
    if isinstance(r, ChatCompletionRequest):
        return (r.top_logprobs or 0) if r.logprobs else None
    return r.logprobs
