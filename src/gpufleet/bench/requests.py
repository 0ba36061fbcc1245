"""OpenAI request bodies for completions and chat, and the history of a multi-turn session.

`--input-tokens N` means the new user text has exactly N words (= N tokens of the shared
tokenizer). On the completions endpoint that is the whole prompt; on the chat endpoint
the chat template adds its markers around it (`<|user|> ... <|end|> <|assistant|>`: 3
more tokens for one message), so the server's prompt is a few tokens longer.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from gpufleet.workload.types import Turn

Endpoint = Literal["completions", "chat"]
# The shared chat template (gpufleet.tokenizer.CHAT_TEMPLATE_JINJA) wraps each message in
# two marker tokens and ends the prompt with one more.
CHAT_MARKERS_PER_MESSAGE = 2
CHAT_GENERATION_MARKERS = 1
ENDPOINT_PATHS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


def completions_body(
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    return _streamed(body, ignore_eos, extra)


def chat_body(
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_completion_tokens": max_tokens,
    }
    return _streamed(body, ignore_eos, extra)


def _streamed(
    body: dict[str, Any], ignore_eos: bool, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """Ask for a stream with usage in its last event (vLLM's benchmark does the same)."""
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return body


class ConversationHistory:
    """Builds each turn's request so it carries every earlier turn and answer."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        *,
        ignore_eos: bool = False,
        extra: dict[str, Any] | None = None,
    ):
        self.endpoint = endpoint
        self.model = model
        self.ignore_eos = ignore_eos
        self.extra = extra
        self._messages: list[dict[str, Any]] = []
        self._prompt = ""
        self._history_tokens = 0  # tokens of earlier turns and answers, as the server counts

    def request(self, turn: Turn) -> tuple[bytes, int]:
        """The JSON body for `turn` and its prompt length in tokens (as the server counts)."""
        if self.endpoint == "chat":
            self._messages.append({"role": "user", "content": turn.text})
            body = chat_body(
                self.model,
                self._messages,
                turn.output_tokens,
                ignore_eos=self.ignore_eos,
                extra=self.extra,
            )
            # Each message adds `<|role|>` and `<|end|>`; the prompt ends with `<|assistant|>`.
            self._history_tokens += CHAT_MARKERS_PER_MESSAGE + turn.input_tokens
            prompt_tokens = self._history_tokens + CHAT_GENERATION_MARKERS
        else:
            self._prompt = f"{self._prompt} {turn.text}" if self._prompt else turn.text
            body = completions_body(
                self.model,
                self._prompt,
                turn.output_tokens,
                ignore_eos=self.ignore_eos,
                extra=self.extra,
            )
            self._history_tokens += turn.input_tokens
            prompt_tokens = self._history_tokens
        return json.dumps(body).encode(), prompt_tokens

    def add_answer(self, text: str) -> None:
        """Record the answer to the last turn, so the next turn includes it."""
        answer = text.strip()
        n_words = len(answer.split())
        if self.endpoint == "chat":
            self._messages.append({"role": "assistant", "content": answer})
            self._history_tokens += CHAT_MARKERS_PER_MESSAGE + n_words
        elif answer:
            self._prompt = f"{self._prompt} {answer}"
            self._history_tokens += n_words
