"""One choice of an answer: what the client sees of the tokens the engine emits.

Each emitted token becomes a piece of text — a vocabulary word, or the next piece of a
scripted answer (JSON for response_format, tool-call arguments, a structured `choice`) —
then passes stop strings and stop token ids, and carries synthetic logprobs. Used by the
non-streamed answer and by the general streaming path alike.
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.replica.protocol import GenerationParams
from gpufleet.replica.runner import RequestStream
from gpufleet.replica.stops import StopScanner
from gpufleet.replica.synthetic import ToolCallPlan, logprob_entries
from gpufleet.tokenizer import Tokenizer


class ChoiceOutput:
    def __init__(
        self,
        index: int,
        stream: RequestStream,
        params: GenerationParams,
        tokenizer: Tokenizer,
        *,
        seed: int,
        script: list[str] | None = None,
        tool: ToolCallPlan | None = None,
    ):
        self.index = index
        self.stream = stream
        self.req = stream.req
        self.p = params
        self.tok = tokenizer
        self.seed = seed
        self.script = script
        self.tool = tool
        self.scanner = (
            StopScanner(params.stop, params.include_stop_str_in_output) if params.stop else None
        )
        self.stop_ids = set(params.stop_token_ids)
        self.token_ids: list[int] = []  # tokens taken from the engine
        self.token_texts: list[str] = []
        self.raw_len = 0  # characters of all taken tokens' text
        self.text = ""  # text released to the client (after stop-string hold-back)
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.reported = 0  # tokens whose logprobs / ids were handed out
        self.header_sent = False  # a tool call's id and name went out

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def _piece(self, position: int, token_id: int) -> str:
        if self.script is not None and position < len(self.script):
            return self.script[position]
        return self.tok.token_text(token_id)

    def take(self) -> str:
        """Newly releasable text (may be ""); sets finish_reason once the choice is over."""
        if self.done:
            return ""
        s, req = self.stream, self.req
        base = req.num_prompt_tokens
        ids = req.all_token_ids[base + s.sent : base + s.available]
        start = s.sent
        s.sent += len(ids)
        raw = []
        for j, tid in enumerate(ids):
            if tid in self.stop_ids:
                s.sent = start + j + 1
                self.token_ids.append(tid)
                self.token_texts.append("")
                self.finish_reason, self.stop_reason = "stop", tid
                break
            piece = self._piece(start + j, tid)
            self.token_ids.append(tid)
            self.token_texts.append(piece)
            raw.append(piece)
        new = "".join(raw)
        self.raw_len += len(new)
        final = self.done or (s.ended and s.sent >= s.available)
        if self.scanner is not None:
            new = self.scanner.feed(new, final)
            if self.scanner.matched is not None:
                self.finish_reason, self.stop_reason = "stop", self.scanner.matched
        self.text += new
        if final and self.finish_reason is None:
            self.finish_reason = str(req.finish_reason)
        return new

    def _reportable(self, final: bool) -> int:
        """Tokens any of whose text went out (all tokens taken, at the end without a stop)."""
        if self.scanner is None:
            return len(self.token_ids)
        released, pos = len(self.text), 0
        count = 0
        for piece in self.token_texts:
            if pos >= released and not (final and self.scanner.matched is None):
                break
            pos += len(piece)
            count += 1
        return count

    def take_reported(self, final: bool = False) -> list[int]:
        """Positions of tokens not yet reported (for logprobs and token ids)."""
        upto = self._reportable(final or self.done)
        out = list(range(self.reported, upto))
        self.reported = upto
        return out

    @property
    def api_finish_reason(self) -> str | None:
        """finish_reason as vLLM reports it: tool_calls for required/auto tool calls."""
        if self.finish_reason == "stop" and self.tool is not None and self.p.tool_choice != "named":
            return "tool_calls"
        return self.finish_reason

    # ------------------------------------------------------------------ logprobs
    def _token_str(self, position: int) -> str:
        tid = self.token_ids[position]
        return f"token_id:{tid}" if self.p.tokens_as_ids else self.token_texts[position]

    def _alt_str(self, tid: int) -> str:
        return f"token_id:{tid}" if self.p.tokens_as_ids else self.tok.token_text(tid)

    def chat_logprobs(self, positions: list[int]) -> dict[str, Any] | None:
        k = self.p.logprobs
        if k is None:
            return None
        content = []
        for pos in positions:
            lp, top = logprob_entries(self.seed, pos, self.token_ids[pos], k, self.tok)
            token = self._token_str(pos)
            tops = [{"token": token, "logprob": lp, "bytes": list(token.encode())}]
            tops += [
                {"token": (t := self._alt_str(tid)), "logprob": v, "bytes": list(t.encode())}
                for tid, v in top[1:]
            ]
            content.append(
                {
                    "token": token,
                    "logprob": lp,
                    "bytes": list(token.encode()),
                    "top_logprobs": tops[:k],
                }
            )
        return {"content": content}

    def completion_logprobs(self, positions: list[int], offset0: int) -> dict[str, Any] | None:
        """OpenAI's legacy shape; `offset0` is where this choice's text starts (echo)."""
        k = self.p.logprobs
        if k is None:
            return None
        tokens, token_lps, tops, offsets = [], [], [], []
        offset = offset0 + sum(len(t) for t in self.token_texts[: positions[0]]) if positions else 0
        for pos in positions:
            lp, top = logprob_entries(self.seed, pos, self.token_ids[pos], k, self.tok)
            token = self._token_str(pos)
            tokens.append(token)
            token_lps.append(lp)
            entry = {token: lp}
            for tid, v in top[1:]:
                entry.setdefault(self._alt_str(tid), v)
            tops.append(entry)
            offsets.append(offset)
            offset += len(self.token_texts[pos])
        return {
            "text_offset": offsets,
            "token_logprobs": token_lps,
            "tokens": tokens,
            "top_logprobs": tops,
        }

    # ------------------------------------------------------------------ deltas
    def chat_delta(self, text: str) -> dict[str, Any] | None:
        """The chunk's delta for newly released text (None: nothing to say)."""
        if self.tool is None:
            return {"content": text} if text else None
        call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
        if not self.header_sent:
            self.header_sent = True
            call = {
                "index": 0,
                "id": self.tool.call_id,
                "type": "function",
                "function": {"name": self.tool.name, "arguments": text},
            }
        elif not text:
            return None
        return {"tool_calls": [call]}

    def chat_message(self) -> dict[str, Any]:
        if self.tool is None:
            return {"role": "assistant", "content": self.text, "reasoning_content": None,
                    "tool_calls": []}  # fmt: skip
        call = {
            "id": self.tool.call_id,
            "type": "function",
            "function": {"name": self.tool.name, "arguments": self.text},
        }
        content = None if self.p.tool_choice == "auto" else ""
        return {"role": "assistant", "content": content, "reasoning_content": None,
                "tool_calls": [call]}  # fmt: skip

    def token_ids_of(self, positions: list[int]) -> list[int]:
        return [self.token_ids[p] for p in positions]


def dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False).encode()
