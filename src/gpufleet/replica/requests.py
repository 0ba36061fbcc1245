"""The request bodies of /v1/completions and /v1/chat/completions, as vLLM's OpenAI server
defines them (`vllm/entrypoints/openai/protocol.py`: fields, defaults, validators).

Pydantic does the shape checks; the `model_validator`s carry vLLM's cross-field rules with
vLLM's messages. Every field vLLM accepts is declared here; what the simulated replica does
with each is decided in `gpufleet.replica.params` (honoured, or refused with a 400 naming the
field). Unknown fields are allowed and logged, as vLLM does.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class ParamError(ValueError):
    """A rule broken across fields; `param` names the field for the OpenAI error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


class OpenAIModel(BaseModel):
    # OpenAI's API allows fields a server does not know; vLLM logs and ignores them.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ------------------------------------------------------------------ messages
class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class MediaPart(OpenAIModel):
    """Image, audio, video or file parts: the simulated model is text-only (refused later)."""

    type: Literal[
        "image_url", "input_audio", "audio_url", "video_url", "file", "image_embeds", "refusal"
    ]


ContentPart = Annotated[TextPart | MediaPart, Field(discriminator="type")]


class FunctionCallParam(OpenAIModel):
    name: str
    arguments: str


class ToolCallParam(OpenAIModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class Message(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> Message:
        if self.content is None and self.role in ("system", "developer", "user", "tool"):
            raise ParamError(f"a {self.role} message needs content", param="content")
        if self.role == "tool" and self.tool_call_id is None:
            raise ParamError("a tool message needs tool_call_id", param="tool_call_id")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise ParamError("an assistant message needs content or tool_calls", "content")
        return self


# ------------------------------------------------------------------ response_format, tools
class JsonSchemaFormat(OpenAIModel):
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # structural_tag's own fields (refused by the replica, accepted in shape here)
    structures: list[Any] | None = None
    triggers: list[str] | None = None
    format: Any = None


class StructuredOutputs(StrictModel):
    """vLLM's `structured_outputs` (guided decoding) parameters."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


class FunctionDefinition(OpenAIModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(OpenAIModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


StopParam = str | Annotated[list[str], Field(max_length=1024)] | None
TokenId = Annotated[int, Field(ge=0)]


# ------------------------------------------------------------------ shared validators
def _check_stream_options(data: dict[str, Any]) -> None:
    if data.get("stream_options") and not data.get("stream"):
        raise ParamError(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )


def _check_prompt_logprobs(data: dict[str, Any]) -> None:
    value = _check_count(data, "prompt_logprobs")
    if value is not None and data.get("stream") and (value > 0 or value == -1):
        raise ParamError(
            "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs"
        )


def _check_response_format(data: dict[str, Any]) -> None:
    rf = data.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema" and rf.get("json_schema") is None:
        raise ParamError(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            param="response_format",
        )


def _check_structured_outputs(data: dict[str, Any], *, chat: bool) -> None:
    so = data.get("structured_outputs")
    if not isinstance(so, dict):
        return
    kinds = sum(so.get(k) is not None for k in ("json", "regex", "choice"))
    if kinds > 1:
        raise ParamError(
            "You can only use one kind of constraints for structured outputs "
            "('json', 'regex' or 'choice').",
            param="structured_outputs",
        )
    if chat and kinds and data.get("tool_choice", "none") not in ("none", "auto", "required"):
        raise ParamError(
            "You can only either use constraints for structured outputs or tools, not both.",
            param="structured_outputs",
        )


def _check_count(data: dict[str, Any], name: str) -> int | None:
    """A logprobs count: an integer, positive or -1 (all), as vLLM checks it."""
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ParamError(f"`{name}` must be an integer.", param=name)
    if value < 0 and value != -1:
        raise ParamError(f"`{name}` must be a positive value or -1.", param=name)
    return value


def _check_common(data: dict[str, Any], *, chat: bool) -> None:
    _check_stream_options(data)
    _check_prompt_logprobs(data)
    _check_response_format(data)
    _check_structured_outputs(data, chat=chat)


class _SamplingFields(OpenAIModel):
    """Sampling parameters both endpoints take (vLLM's extra sampling params included)."""

    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = 1
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopParam = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extra sampling parameters
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    prompt_logprobs: int | None = None
    allowed_token_ids: list[TokenId] | None = None
    bad_words: list[str] = Field(default_factory=list)
    # vLLM's extra parameters
    add_special_tokens: bool | None = None
    structured_outputs: StructuredOutputs | None = None
    priority: int = Field(0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    logits_processors: list[Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields):
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    prompt_embeds: bytes | list[bytes] | None = None
    echo: bool | None = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    suffix: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _vllm_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        _check_common(data, chat=False)
        _check_count(data, "logprobs")
        prompt = data.get("prompt")
        if (prompt is None or prompt == "") and not data.get("prompt_embeds"):
            raise ParamError(
                "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt"
            )
        if data.get("max_tokens") is None:  # null means the default, as in vLLM
            data = {**data, "max_tokens": 16}
        return data


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[Message], Field(min_length=1)]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[ToolParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = "none"
    parallel_tool_calls: bool | None = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    include_reasoning: bool = True
    # vLLM's chat extras
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _vllm_rules(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        _check_common(data, chat=True)
        top = _check_count(data, "top_logprobs")
        if top is not None and top != 0 and not data.get("logprobs"):
            raise ParamError(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                param="top_logprobs",
            )
        if data.get("continue_final_message") and data.get("add_generation_prompt", True):
            raise ParamError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                param="continue_final_message",
            )
        return _check_tools(data)


def _check_tools(data: dict[str, Any]) -> dict[str, Any]:
    """vLLM's tool rules: tools and tool_choice agree; tool_choice defaults to auto."""
    tools = data.get("tools")
    if tools == []:
        raise ParamError(
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.",
            param="tools",
        )
    if "tool_choice" not in data and tools:
        data = {**data, "tool_choice": "auto"}
    choice = data.get("tool_choice")
    if choice is None or choice == "none":
        return data
    if tools is None:
        raise ParamError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ParamError(
                'Invalid value for `tool_choice`. Correct usage: `{"type": "function", '
                '"function": {"name": "my_function"}}`',
                param="tool_choice",
            )
        names = [
            t.get("function", {}).get("name")
            for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        ]
        if function["name"] not in names:
            raise ParamError(
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                param="tool_choice",
            )
    elif choice not in ("auto", "required"):
        raise ParamError(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or '
            '"required" are supported.',
            param="tool_choice",
        )
    return data


@functools.cache
def declared_fields(model: type[BaseModel]) -> frozenset[str]:
    """Field names and aliases a model declares (anything else is an unknown field)."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        out.add(name)
        if info.alias:
            out.add(info.alias)
    return frozenset(out)
