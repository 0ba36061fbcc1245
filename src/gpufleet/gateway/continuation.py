"""Resuming a stream on another replica: what the client already got, the request that
continues it, and the continuation's events rewritten to fit the first part.

Pure (no I/O), so every rule here is tested without a network:
- `Transcript` keeps what was relayed to the client (raw events, folded into text as it
  grows) and reads it back as a `StreamState`: id, text so far, tokens so far (events with
  content: engines stream one token per event), finish reason, usage.
- `continuation_body` is the request that continues the answer: completions get the
  prompt plus the text so far and `max_tokens` reduced by the tokens so far; chat gets the
  messages plus a final assistant message with the partial answer and the engine's way of
  continuing it (vLLM: `continue_final_message: true, add_generation_prompt: false`;
  SGLang: `continue_final_message: true`). None when the request cannot be continued.
- `Splicer` rewrites the continuation's events: the first part's `id` and `created`, no
  second role chunk, and usage that adds up (prompt tokens of the original request,
  completion tokens of the whole answer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DIALECTS = ("vllm", "sglang", "none")
# OpenAI's and vLLM's max_tokens of /v1/completions when the request does not set it.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
_FOLD_BYTES = 64 << 10  # raw events kept per stream before folding them into text
# Fields whose meaning a continuation would change (a grammar restarted mid-answer, n
# answers, prompt echo with its logprobs): such requests are not continued once they
# have text.
_NOT_CONTINUABLE = ("response_format", "guided_json", "guided_regex", "guided_choice",
                    "guided_grammar", "structured_outputs", "tools", "functions")  # fmt: skip


def event_boundary(data: bytes) -> int:
    """The length of the complete SSE events at the start of `data` (0: none complete)."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def iter_events(data: bytes) -> list[bytes]:
    """The `data:` payloads of complete SSE events ([DONE] included)."""
    out = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        payload = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if payload:
            out.append(b"\n".join(payload))
    return out


@dataclass(slots=True)
class StreamState:
    """What the client has received of one streamed answer."""

    chat: bool
    id: str | None = None
    created: int | None = None
    text: str = ""
    tokens: int = 0  # content events (engines stream one token per event)
    usage_tokens: int | None = None  # completion tokens per the stream's own usage, if any
    usage_prompt_tokens: int | None = None  # prompt tokens per the same usage
    role_sent: bool = False
    finish_reason: str | None = None
    usage_sent: bool = False
    done: bool = False
    uncontinuable: str | None = None  # why the answer cannot be continued (tool calls, n > 1)

    @property
    def completion_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.tokens

    def add(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError):
            return
        if not isinstance(event, dict):
            return
        if self.id is None and isinstance(event.get("id"), str):
            self.id = event["id"]
            created = event.get("created")
            self.created = created if isinstance(created, int) else None
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage_sent = True
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.usage_prompt_tokens = usage["prompt_tokens"]
        for choice in event.get("choices") or ():
            self._add_choice(choice)

    def _add_choice(self, choice: Any) -> None:
        if not isinstance(choice, dict):
            return
        if choice.get("index", 0) != 0:
            self.uncontinuable = "more than one choice (n > 1)"
            return
        if self.chat:
            delta = choice.get("delta") or {}
            if delta.get("role"):
                self.role_sent = True
            if delta.get("tool_calls"):
                self.uncontinuable = "the answer holds tool calls"
            content = delta.get("content")
        else:
            content = choice.get("text")
        if isinstance(content, str) and content:
            self.text += content
            self.tokens += 1
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]


class Transcript:
    """The events relayed to one client, kept cheaply: a list of the relayed byte strings,
    folded into a `StreamState` when they grow past 64 KiB (the hot path only appends)."""

    __slots__ = ("_parts", "_size", "_state")

    def __init__(self, chat: bool) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._state = StreamState(chat)

    def add(self, events: bytes) -> None:
        """Complete events the client was sent."""
        self._parts.append(events)
        self._size += len(events)
        if self._size > _FOLD_BYTES:
            self._fold()

    def _fold(self) -> None:
        for payload in iter_events(b"".join(self._parts)):
            self._state.add(payload)
        self._parts = []
        self._size = 0

    def state(self) -> StreamState:
        self._fold()
        return self._state

    def usage(self) -> tuple[int, int] | None:
        """(prompt, completion) tokens per the stream's usage (an engine sends it last when
        the client asks, `stream_options.include_usage`), else None. Parses only the
        unfolded events that carry one, so a stream's end stays cheap."""
        # The usage is the last event before [DONE]: in one of the last two parts relayed.
        tail = next((p for p in reversed(self._parts[-2:]) if b'"usage"' in p), None)
        state = self._state  # a usage folded already, else the tail's (apart: not refolded)
        if tail is not None:
            state = StreamState(state.chat)
            for payload in iter_events(tail):
                state.add(payload)
        if state.usage_prompt_tokens is None or state.usage_tokens is None:
            return None
        return state.usage_prompt_tokens, state.usage_tokens


class Finished:
    """The answer needs no continuation: every token it may have was sent."""

    __slots__ = ("finish_reason",)

    def __init__(self, finish_reason: str) -> None:
        self.finish_reason = finish_reason


def continuation_body(
    body: dict[str, Any], chat: bool, state: StreamState, dialect: str
) -> dict[str, Any] | Finished | str:
    """The request that continues the answer, `Finished`, or why it cannot be continued."""
    if state.finish_reason is not None:
        return Finished(state.finish_reason)
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1:
        return "more than one choice (n > 1)"
    if state.uncontinuable:
        return state.uncontinuable
    if not state.text:
        return body  # nothing generated reached the client yet: send it again as it was
    if dialect == "none":
        return "the engine does not continue a partial answer (failover dialect none)"
    for name in _NOT_CONTINUABLE:
        if body.get(name) not in (None, [], {}):
            return f"'{name}' cannot be continued mid-answer"
    out = dict(body)
    k = state.completion_tokens
    for name in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        limit = body.get(name)
        if limit is None and not chat:
            limit = COMPLETIONS_DEFAULT_MAX_TOKENS
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - k <= 0:
                return Finished("length")
            out[name] = limit - k
    if isinstance(body.get("min_tokens"), int):
        out["min_tokens"] = max(0, body["min_tokens"] - k)
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return "'messages' is not a list"
        out["messages"] = [*messages, {"role": "assistant", "content": state.text}]
        out["continue_final_message"] = True
        if dialect == "vllm":
            out["add_generation_prompt"] = False
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return "only a text prompt can be continued"
    out["prompt"] = prompt + state.text
    out.pop("echo", None)  # the client already has the prompt echoed
    return out


class Splicer:
    """Rewrites a continuation's events so that they read as the rest of the first part."""

    __slots__ = ("_chat", "_created", "_id", "_tokens_before")

    def __init__(self, state: StreamState) -> None:
        self._chat = state.chat
        self._id = state.id
        self._created = state.created
        self._tokens_before = state.completion_tokens

    def rewrite(self, events: bytes) -> bytes:
        """Complete SSE events in, the events to relay out (b"" when none is left)."""
        out: list[bytes] = []
        for payload in iter_events(events):
            if payload == b"[DONE]":
                out.append(b"data: [DONE]\n\n")
                continue
            try:
                event = json.loads(payload)
            except (ValueError, RecursionError):
                continue
            if isinstance(event, dict) and self._fix(event):
                out.append(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
        return b"".join(out)

    def _fix(self, event: dict[str, Any]) -> bool:
        """Make one event fit; False to drop it (a second role chunk)."""
        if self._id is not None:
            event["id"] = self._id
        if self._created is not None:
            event["created"] = self._created
        usage = event.get("usage")
        if isinstance(usage, dict):
            k = self._tokens_before
            if isinstance(usage.get("prompt_tokens"), int):
                usage["prompt_tokens"] = max(0, usage["prompt_tokens"] - k)
            if isinstance(usage.get("completion_tokens"), int):
                usage["completion_tokens"] += k
        if not self._chat:
            return True
        keep = bool(usage) or not event.get("choices")
        for choice in event.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and "role" in delta:
                del delta["role"]  # the client has its role chunk already
                if delta.get("content") == "":
                    del delta["content"]
            if not isinstance(delta, dict) or delta or choice.get("finish_reason"):
                keep = True
        return keep
