"""Parse and validate OpenAI completion / chat requests the way vLLM does (400 on bad input).

The result is a `GenerationParams`: the prompt as token ids plus the sampling fields the
simulated replica honours. Fields it accepts but need not act on (temperature, top_p,
seed, ...) are type-checked so a client mistake still gets a clear 400.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from gpufleet.tokenizer import Tokenizer, apply_chat_template


class RequestError(Exception):
    """A request the replica refuses: HTTP status, message and the offending parameter."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


@dataclass(slots=True)
class GenerationParams:
    kind: str  # "completion" or "chat"
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    stop_after_tokens: int | None  # the simulated model's natural end (EOS), if any
    stream: bool
    include_usage: bool
    continuous_usage_stats: bool
    stop: list[str]
    include_stop_str_in_output: bool
    seed: int | None
    echo_prompt: str | None  # completions with echo=true
    continued_tokens: int = 0  # of the prompt, a partial answer being continued


# Without max_tokens, a chat answer ends at the model's EOS after a length drawn from the
# prompt (deterministic), within these bounds; max_model_len still caps it.
NATURAL_MIN_TOKENS = 16
NATURAL_MAX_TOKENS = 512
# OpenAI's and vLLM's default max_tokens for /v1/completions.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _opt_number(body: dict[str, Any], name: str, lo: float, hi: float) -> None:
    v = body.get(name)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RequestError(f"{name} must be a number", param=name)
    if not lo <= v <= hi:
        raise RequestError(f"{name} must be between {lo} and {hi}, got {v}", param=name)


def _opt_int(body: dict[str, Any], name: str, lo: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"{name} must be an integer", param=name)
    if lo is not None and v < lo:
        raise RequestError(f"{name} must be at least {lo}, got {v}", param=name)
    return v


def _opt_bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(f"{name} must be a boolean", param=name)
    return v


def _parse_stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("stop must be a string or a list of strings", param="stop")
    if any(s == "" for s in stop):
        raise RequestError("stop strings must not be empty", param="stop")
    return stop


def _completion_prompt(body: dict[str, Any], tokenizer: Tokenizer) -> tuple[list[int], str | None]:
    prompt = body.get("prompt")
    if prompt is None:
        raise RequestError("prompt is required", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt), prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        if any(not 0 <= t < tokenizer.vocab_size for t in prompt):
            raise RequestError(f"token ids must be in [0, {tokenizer.vocab_size})", param="prompt")
        return list(prompt), None
    if isinstance(prompt, list) and len(prompt) > 1:
        raise RequestError("only one prompt per request is supported", param="prompt")
    raise RequestError(
        "prompt must be a string, a list of token ids, or a list with one of those",
        param="prompt",
    )


def _chat_prompt(body: dict[str, Any], tokenizer: Tokenizer) -> tuple[list[int], int]:
    """The prompt's token ids, and how many of them are a partial answer the model is
    asked to continue (`continue_final_message`), as vLLM takes it."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a role", param="messages")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RequestError(
                f"messages[{i}].content must be a string or a list of parts", param="messages"
            )
    add_generation_prompt = _opt_bool(body, "add_generation_prompt", True)
    continue_final = _opt_bool(body, "continue_final_message")
    if not continue_final:
        return tokenizer.encode(apply_chat_template(messages, add_generation_prompt)), 0
    if add_generation_prompt:
        raise RequestError("Cannot set both `continue_final_message` and "
                           "`add_generation_prompt` to True.", param="continue_final_message")  # fmt: skip
    if messages[-1].get("role") != "assistant":
        raise RequestError("continue_final_message needs a final assistant message",
                           param="continue_final_message")  # fmt: skip
    ids = tokenizer.encode(apply_chat_template(messages, False, continue_final_message=True))
    partial = len(tokenizer.encode(apply_chat_template(messages[-1:], False, True))) - 1
    return ids, partial


def parse_generation_request(
    body: Any,
    *,
    kind: str,
    served_model_names: list[str],
    max_model_len: int,
    tokenizer: Tokenizer,
) -> GenerationParams:
    """Validate a request body; raise RequestError with vLLM's status and message."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        model = served_model_names[0]  # vLLM serves the first name when none is given
    if not isinstance(model, str):
        raise RequestError("model must be a string", param="model")
    if model not in served_model_names:
        raise RequestError(f"The model `{model}` does not exist.", status=404, param="model")

    n = _opt_int(body, "n", 1)
    if n is not None and n != 1:
        raise RequestError("only n=1 is supported", param="n")
    _opt_number(body, "temperature", 0.0, 2.0)
    _opt_number(body, "top_p", 0.0, 1.0)
    _opt_number(body, "presence_penalty", -2.0, 2.0)
    _opt_number(body, "frequency_penalty", -2.0, 2.0)
    seed = _opt_int(body, "seed")
    stream = _opt_bool(body, "stream")
    ignore_eos = _opt_bool(body, "ignore_eos")
    stream_options = body.get("stream_options")
    include_usage = continuous = False
    if stream_options is not None:
        if not stream:
            raise RequestError(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        if not isinstance(stream_options, dict):
            raise RequestError("stream_options must be an object", param="stream_options")
        include_usage = _opt_bool(stream_options, "include_usage")
        continuous = _opt_bool(stream_options, "continuous_usage_stats")

    echo_prompt = None
    continued = 0
    if kind == "chat":
        prompt_ids, continued = _chat_prompt(body, tokenizer)
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 1)
    else:
        prompt_ids, prompt_text = _completion_prompt(body, tokenizer)
        max_tokens = _opt_int(body, "max_tokens", 1)
        if max_tokens is None:
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
        if _opt_bool(body, "echo"):
            echo_prompt = prompt_text if prompt_text is not None else tokenizer.decode(prompt_ids)
    if not prompt_ids:
        raise RequestError("the prompt is empty", param="prompt" if kind != "chat" else "messages")

    num_prompt = len(prompt_ids)
    if num_prompt >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {num_prompt} input tokens. Please reduce the length of the input "
            "messages.",
            param="messages" if kind == "chat" else "prompt",
        )
    stop_after = None
    if max_tokens is None:
        max_tokens = max_model_len - num_prompt
        if not ignore_eos:
            # Where the model ends the answer it continues (counted from its start).
            answer_start = prompt_ids[: num_prompt - continued]
            stop_after = max(1, natural_length(answer_start, seed) - continued)
    elif num_prompt + max_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            param="max_tokens",
        )
    return GenerationParams(
        kind=kind,
        model=model,
        prompt_token_ids=prompt_ids,
        max_tokens=max_tokens,
        stop_after_tokens=stop_after,
        stream=stream,
        include_usage=include_usage,
        continuous_usage_stats=continuous,
        stop=_parse_stop(body),
        include_stop_str_in_output=_opt_bool(body, "include_stop_str_in_output"),
        seed=seed,
        echo_prompt=echo_prompt,
        continued_tokens=continued,
    )


def natural_length(prompt_ids: list[int], seed: int | None) -> int:
    """The simulated model's answer length when no max_tokens bounds it (deterministic)."""
    h = zlib.crc32(repr((seed, len(prompt_ids), prompt_ids[-8:])).encode())
    return NATURAL_MIN_TOKENS + h % (NATURAL_MAX_TOKENS - NATURAL_MIN_TOKENS + 1)
