"""From a request body to what the simulated replica generates (`GenerationParams`).

`gpufleet.replica.requests` checks the shape with vLLM's pydantic models; here each field
vLLM accepts is either honoured (it changes what the replica answers or how it schedules)
or refused with a 400 naming it — never silently dropped. Sampling knobs that shape a real
model's probabilities (temperature, top_p, penalties, ...) are range-checked as vLLM's
`SamplingParams` does; the simulated model's words do not depend on them.
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from gpufleet.replica.errors import RequestError
from gpufleet.replica.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    MediaPart,
    ParamError,
    declared_fields,
)
from gpufleet.replica.sampling import asked_logprobs, check_sampling
from gpufleet.tokenizer import Tokenizer, apply_chat_template

log = logging.getLogger("gpufleet.replica")

# Without max_tokens, a chat answer ends at the model's EOS after a length drawn from the
# prompt (deterministic), within these bounds; max_model_len still caps it.
NATURAL_MIN_TOKENS = 16
NATURAL_MAX_TOKENS = 512
# vLLM's --max-logprobs default: the most top logprobs a request may ask for.
MAX_LOGPROBS = 20
# vLLM's VLLM_MAX_N-like guard: choices per request the replica accepts.
MAX_N = 128


OutputKind = Literal["text", "json", "tool", "choice"]


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
    echo_prompt: str | None  # completions with echo=true; chat echo of an assistant turn
    n: int = 1
    max_tokens_param: int | None = None  # as the client sent it (vllm:request_params_*)
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None  # top logprobs per token; None: no logprobs
    prompt_logprobs: int | None = None
    return_token_ids: bool = False
    tokens_as_ids: bool = False
    request_id: str | None = None
    cache_salt: str | None = None
    prompt_text: str | None = None  # the templated prompt (chat)
    # What the answer is: words, JSON (schema None: any object), a tool call, one of choices.
    output: OutputKind = "text"
    json_schema: dict[str, Any] | None = None
    choices: list[str] = field(default_factory=list)
    tools: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)
    tool_choice: str = "none"  # none, auto, required, named
    tool_name: str | None = None
    last_role: str = "user"

    @property
    def plain(self) -> bool:
        """Nothing per token beyond words: the fast streaming path applies."""
        return (
            self.n == 1
            and self.output == "text"
            and not self.tools
            and self.logprobs is None
            and not self.stop_token_ids
            and not self.return_token_ids
        )


def _param_of(err: dict[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    inner = ctx.get("error")
    if isinstance(inner, ParamError) and inner.param:
        return inner.param
    # Drop pydantic's union-branch markers ('str', 'list[int]', 'function-after[...]').
    parts = []
    for p in err.get("loc", ()):
        s = str(p)
        if any(c in s for c in "[]()") or s in ("str", "int", "float", "bool", "list", "dict"):
            continue
        parts.append(s)
    return ".".join(parts)


def validation_error(e: ValidationError) -> RequestError:
    """The first pydantic error as vLLM's 400: the message names the field."""
    err = e.errors()[0]
    param = _param_of(dict(err))
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, ParamError):
        return RequestError(inner.message, inner.status, inner.param or param or None)
    msg = err.get("msg", "invalid value")
    return RequestError(f"{param}: {msg}" if param else msg, 400, param or None)


def _output_spec(r: CompletionRequest | ChatCompletionRequest, p: GenerationParams) -> None:
    """Decide what the answer is made of: words, JSON, one of a few choices, a tool call."""
    so = r.structured_outputs
    rf = r.response_format
    if so is not None:
        for name in ("regex", "grammar", "structural_tag"):
            if getattr(so, name) is not None:
                raise RequestError(
                    f"structured_outputs.{name} is not simulated by gpufleet replica "
                    "(json, json_object and choice are)",
                    param=f"structured_outputs.{name}",
                )
        if so.choice is not None:
            if not so.choice:
                raise RequestError("choice must not be empty", param="structured_outputs.choice")
            p.output, p.choices = "choice", list(so.choice)
        elif so.json_ is not None:
            schema = so.json_
            if isinstance(schema, str):
                import json

                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise RequestError(
                        f"structured_outputs.json is not valid JSON: {e}",
                        param="structured_outputs.json",
                    ) from None
            p.output, p.json_schema = "json", schema
        elif so.json_object:
            p.output = "json"
    if rf is not None and rf.type != "text":
        if rf.type == "structural_tag":
            raise RequestError(
                "response_format structural_tag is not simulated by gpufleet replica",
                param="response_format",
            )
        p.output = "json"
        if rf.type == "json_schema" and rf.json_schema is not None:
            p.json_schema = rf.json_schema.json_schema or {}
    if isinstance(r, ChatCompletionRequest) and r.tools and r.tool_choice not in (None, "none"):
        p.tools = [(t.function.name, t.function.parameters) for t in r.tools]
        if isinstance(r.tool_choice, str):
            p.tool_choice = r.tool_choice
        else:
            p.tool_choice, p.tool_name = "named", r.tool_choice.function.name


def _chat_messages(r: ChatCompletionRequest) -> list[dict[str, Any]]:
    if r.chat_template is not None:
        raise RequestError(
            "Chat template is passed with request, but --trust-request-chat-template is not "
            "set. Refused request with untrusted chat template.",
            param="chat_template",
        )
    out = []
    for i, m in enumerate(r.messages):
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if isinstance(part, MediaPart):
                    raise RequestError(
                        f"the simulated model is text-only: {part.type} content is not supported",
                        param=f"messages.{i}.content.{j}",
                    )
        content: Any = m.content
        if isinstance(content, list):
            content = [part.model_dump() for part in content]
        out.append({"role": m.role, "content": content})
    return out


def natural_length(prompt_ids: list[int], seed: int | None) -> int:
    """The simulated model's answer length when no max_tokens bounds it (deterministic)."""
    h = zlib.crc32(repr((seed, len(prompt_ids), prompt_ids[-8:])).encode())
    return NATURAL_MIN_TOKENS + h % (NATURAL_MAX_TOKENS - NATURAL_MIN_TOKENS + 1)


def _warn_unknown(
    body: dict[str, Any], model: type[CompletionRequest | ChatCompletionRequest]
) -> None:
    unknown = sorted(set(body) - declared_fields(model))
    if unknown:  # as vLLM: accepted, logged, no effect
        log.warning("The following fields were present in the request but ignored: %s", unknown)


def parse_generation_request(
    body: Any,
    *,
    kind: str,
    served_model_names: list[str],
    max_model_len: int,
    tokenizer: Tokenizer,
    max_logprobs: int = MAX_LOGPROBS,
) -> GenerationParams:
    """Validate a request body; raise RequestError with vLLM's status and message."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
    try:
        r = schema.model_validate(body)
    except ValidationError as e:
        raise validation_error(e) from None
    except ParamError as e:
        raise RequestError(e.message, e.status, e.param) from None
    _warn_unknown(body, schema)
    model = r.model if r.model is not None else served_model_names[0]
    if model not in served_model_names:
        raise RequestError(f"The model `{model}` does not exist.", status=404, param="model")
    check_sampling(r, tokenizer.vocab_size, max_logprobs, MAX_N)

    echo_prompt = prompt_text = None
    last_role = "user"
    if isinstance(r, ChatCompletionRequest):
        messages = _chat_messages(r)
        prompt_text = apply_chat_template(
            messages, r.add_generation_prompt, continue_final_message=r.continue_final_message
        )
        prompt_ids = tokenizer.encode(prompt_text)
        max_tokens = (
            r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
        )
        param = "max_completion_tokens" if r.max_completion_tokens is not None else "max_tokens"
        last_role = r.messages[-1].role
        if r.echo and last_role == "assistant" and isinstance(messages[-1]["content"], str):
            echo_prompt = messages[-1]["content"]
    else:
        prompt_ids, text = _completion_prompt(r, tokenizer)
        max_tokens, param = r.max_tokens, "max_tokens"
        if r.echo:
            echo_prompt = text if text is not None else tokenizer.decode(prompt_ids).lstrip()
        if r.suffix is not None:
            raise RequestError("suffix is not currently supported", param="suffix")
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(f"{param} must be at least 1, got {max_tokens}.", param=param)
    if r.truncate_prompt_tokens is not None and r.truncate_prompt_tokens >= 0:
        keep = r.truncate_prompt_tokens
        if keep > max_model_len:
            raise RequestError(
                f"truncate_prompt_tokens value ({keep}) is greater than max_model_len "
                f"({max_model_len}). Please request a smaller truncation size.",
                param="truncate_prompt_tokens",
            )
        prompt_ids = prompt_ids[:keep] if r.truncation_side == "right" else prompt_ids[-keep:]
    where = "messages" if kind == "chat" else "prompt"
    if not prompt_ids:
        raise RequestError("the prompt is empty", param=where)
    num_prompt = len(prompt_ids)
    if num_prompt >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {num_prompt} input tokens. Please reduce the length of the input "
            "messages.",
            param=where,
        )
    max_tokens_param = max_tokens
    stop_after = None
    if max_tokens is None:
        max_tokens = max_model_len - num_prompt
        if not r.ignore_eos:
            stop_after = max(natural_length(prompt_ids, r.seed), r.min_tokens)
    elif num_prompt + max_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            param=param,
        )
    if r.min_tokens > max_tokens:
        raise RequestError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got "
            f"{r.min_tokens}.",
            param="min_tokens",
        )
    stop = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
    if any(s == "" for s in stop):
        raise RequestError("stop strings must not be empty", param="stop")
    so = r.stream_options
    p = GenerationParams(
        kind=kind,
        model=model,
        prompt_token_ids=prompt_ids,
        max_tokens=max_tokens,
        stop_after_tokens=stop_after,
        stream=bool(r.stream),
        include_usage=bool(so and so.include_usage),
        continuous_usage_stats=bool(so and so.include_usage and so.continuous_usage_stats),
        stop=stop,
        include_stop_str_in_output=r.include_stop_str_in_output,
        seed=r.seed,
        echo_prompt=echo_prompt,
        n=r.n or 1,
        max_tokens_param=max_tokens_param,
        min_tokens=r.min_tokens,
        stop_token_ids=list(r.stop_token_ids or []),
        logprobs=asked_logprobs(r),
        prompt_logprobs=r.prompt_logprobs,
        return_token_ids=bool(r.return_token_ids),
        tokens_as_ids=bool(r.return_tokens_as_token_ids),
        request_id=r.request_id,
        cache_salt=r.cache_salt,
        prompt_text=prompt_text,
        last_role=last_role,
    )
    _output_spec(r, p)
    return p


def _completion_prompt(r: CompletionRequest, tokenizer: Tokenizer) -> tuple[list[int], str | None]:
    if r.prompt_embeds is not None:
        raise RequestError(
            "prompt_embeds are not supported by the simulated model", param="prompt_embeds"
        )
    prompt: Any = r.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt), prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        if any(t >= tokenizer.vocab_size for t in prompt):
            raise RequestError(f"token ids must be in [0, {tokenizer.vocab_size})", param="prompt")
        return list(prompt), None
    raise RequestError(
        "only one prompt per request is supported (send one request per prompt)",
        param="prompt",
    )
