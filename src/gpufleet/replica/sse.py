"""Server-sent-event chunks of a streamed completion, pre-serialized (vLLM's fields).

Per step only the text (and, with continuous usage stats, the counts) change, so each
response builds its chunk templates once and a token costs two byte concatenations.
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.openai_errors import error_json_bytes


def escape(text: str) -> bytes:
    """JSON string contents (without quotes) for text that may hold any character."""
    return json.dumps(text)[1:-1].encode()


def error_event(message: str, status: int) -> bytes:
    return b"data: " + error_json_bytes(message, status) + b"\n\ndata: [DONE]\n\n"


class ChunkTemplates:
    def __init__(
        self,
        *,
        chat: bool,
        request_id: str,
        created: int,
        model: str,
        prompt_tokens: int,
        continuous_usage: bool,
    ):
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self.continuous_usage = continuous_usage
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head_json = (
            f'{{"id":"{request_id}","object":"{obj}","created":{created},'
            f'"model":{json.dumps(model)},'
        )
        self.head = f'data: {self.head_json}"choices":[{{"index":0,'.encode()
        if chat:
            self.text_open = b'"delta":{"content":"'
            self.text_close = b'"},"logprobs":null,"finish_reason":'
        else:
            self.text_open = b'"text":"'
            self.text_close = b'","logprobs":null,"finish_reason":'
        self.mid_tail = b'null,"stop_reason":null}]'
        # the common chunk (one token mid-stream, no per-chunk usage): open + text + close
        self.token_open = self.head + self.text_open
        self.token_close = self.text_close + self.mid_tail + b"}\n\n"

    def usage_tail(self, completion_tokens: int) -> bytes:
        if not self.continuous_usage:
            return b"}\n\n"
        p = self.prompt_tokens
        return (
            f',"usage":{{"prompt_tokens":{p},"total_tokens":{p + completion_tokens},'
            f'"completion_tokens":{completion_tokens}}}}}\n\n'
        ).encode()

    def role_chunk(self) -> bytes:
        """vLLM's first chat chunk: the role, no content yet."""
        return (
            self.head + b'"delta":{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}]' + self.usage_tail(0)
        )

    def text_chunk(
        self,
        body: bytes,
        completion_tokens: int,
        finish_reason: str | None = None,
        stop_reason: str | None = None,
    ) -> bytes:
        """A chunk of text (`body` already JSON-escaped); the last one names its finish."""
        out = self.head + self.text_open + body + self.text_close
        if finish_reason is None:
            return out + self.mid_tail + self.usage_tail(completion_tokens)
        end = f'"{finish_reason}","stop_reason":{json.dumps(stop_reason)}}}]'.encode()
        return out + end + self.usage_tail(completion_tokens)

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        """include_usage: the last chunk, with no choices and the whole usage."""
        return f'data: {self.head_json}"choices":[],"usage":{json.dumps(usage)}}}\n\n'.encode()
