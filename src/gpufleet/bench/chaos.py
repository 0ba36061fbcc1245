"""Closed-loop clients under disruption, checking every answer against the uninterrupted one.

`run_chaos(url, requests, clients, duration_s, disrupt, every_s)` keeps `clients` requests
in flight for `duration_s` (each client sends its next request when the last one ended)
and calls `disrupt(n)` every `every_s` seconds (SIGKILL a replica, stall one...). Each
answer is checked against what the request would have got without disruption (the caller
knows it: a seeded deterministic replica):

- ok: status 200 and, streamed, a well-formed stream: events that parse, one `id`, the
  role chunk once and first (chat), a finish reason once and last, usage (when asked) that
  adds up, no error event, `[DONE]` once and last; and the text equals the expected one;
- error: a non-200 status, or the connection failed;
- truncated: a stream that stopped without `[DONE]` (the client saw a broken transfer);
- error_event: a stream that ended with an in-band error event;
- wrong_text: well-formed but not the expected answer;
- malformed: anything else wrong with the stream's form (the reason is kept).

Any OpenAI-compatible router can be measured the same way (benchmarks/failover.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gpufleet.tokenizer import apply_chat_template, default_tokenizer

KINDS = ("ok", "error", "truncated", "error_event", "wrong_text", "malformed")


@dataclass(frozen=True, slots=True)
class Expected:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "length"


@dataclass(frozen=True, slots=True)
class ChaosRequest:
    path: str  # /v1/chat/completions or /v1/completions
    body: dict[str, Any]
    expected: Expected


@dataclass
class ChaosReport:
    counts: Counter[str] = field(default_factory=Counter)
    streamed: int = 0
    disruptions: int = 0
    duration_s: float = 0.0
    examples: dict[str, str] = field(default_factory=dict)  # kind -> one detail

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, kind: str, detail: str, stream: bool) -> None:
        self.counts[kind] += 1
        self.streamed += stream
        if kind != "ok":
            self.examples.setdefault(kind, detail[:400])

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "streamed": self.streamed, "disruptions": self.disruptions,
                "duration_s": round(self.duration_s, 2),
                **{k: self.counts.get(k, 0) for k in KINDS}, "examples": self.examples}  # fmt: skip


def check_answer(
    status: int, raw: bytes, stream: bool, chat: bool, expected: Expected
) -> tuple[str, str]:
    """(kind, detail) of one answer; kind is one of KINDS."""
    text = raw.decode("utf-8", "replace")
    if status != 200:
        return "error", f"status {status}: {text[:200]}"
    if not stream:
        try:
            body = json.loads(text)
            choice = body["choices"][0]
            got = choice["message"]["content"] if chat else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            return "malformed", f"not a completion: {text[:200]}"
        return _text_kind(got, expected)
    return _stream_kind(text, chat, expected)


def _text_kind(got: str, expected: Expected) -> tuple[str, str]:
    if got == expected.text:
        return "ok", ""
    return "wrong_text", f"got {got[:120]!r}... expected {expected.text[:120]!r}..."


def _stream_kind(text: str, chat: bool, expected: Expected) -> tuple[str, str]:
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    if not blocks or blocks[-1].strip() != "data: [DONE]":
        return "truncated", f"ends with {text[-120:]!r}"
    events = []
    for block in blocks[:-1]:
        if not block.startswith("data: ") or block.strip() == "data: [DONE]":
            return "malformed", f"unexpected block {block[:120]!r}"
        try:
            events.append(json.loads(block[6:]))
        except ValueError:
            return "malformed", f"not JSON: {block[:120]!r}"
    if any("error" in e for e in events):
        return "error_event", json.dumps(next(e for e in events if "error" in e))[:300]
    ids = {e.get("id") for e in events}
    if len(ids) != 1:
        return "malformed", f"{len(ids)} ids: {sorted(map(str, ids))[:4]}"
    choices = [c for e in events for c in e.get("choices") or ()]
    if chat:
        roles = [i for i, c in enumerate(choices) if (c.get("delta") or {}).get("role")]
        if roles != [0]:
            return "malformed", f"role chunks at {roles[:5]}"
    finishes = [i for i, c in enumerate(choices) if c.get("finish_reason")]
    if finishes != [len(choices) - 1]:
        return "malformed", f"finish reasons at {finishes[:5]} of {len(choices)} choices"
    if choices[-1]["finish_reason"] != expected.finish_reason:
        return "malformed", f"finish_reason {choices[-1]['finish_reason']!r}"
    usages = [e["usage"] for e in events if e.get("usage")]
    if usages:
        u = usages[-1]
        want = (expected.prompt_tokens, expected.completion_tokens,
                expected.prompt_tokens + expected.completion_tokens)  # fmt: skip
        got = (u.get("prompt_tokens"), u.get("completion_tokens"), u.get("total_tokens"))
        if got != want:
            return "malformed", f"usage {got} != {want}"
    pieces = [(c.get("delta") or {}).get("content") if chat else c.get("text") for c in choices]
    return _text_kind("".join(p for p in pieces if p), expected)


async def run_chaos(
    url: str,
    requests: Callable[[int], ChaosRequest],
    *,
    clients: int,
    duration_s: float,
    disrupt: Callable[[int], Awaitable[None]],
    every_s: float,
    settle: Callable[[], Awaitable[None]] | None = None,
    timeout_s: float = 120.0,
) -> ChaosReport:
    """Closed-loop clients for `duration_s` while `disrupt(n)` runs every `every_s`; then
    `settle()` (undo the last disruption) and the requests still in flight are waited for
    (up to `timeout_s` each) and counted."""
    report = ChaosReport()
    counter = iter(range(10**9))
    t0 = time.monotonic()
    stop_at = t0 + duration_s
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            while time.monotonic() < stop_at:
                req = requests(next(counter))
                stream = bool(req.body.get("stream"))
                chat = req.path.endswith("chat/completions")
                try:
                    async with session.post(url + req.path, json=req.body) as resp:
                        raw = await resp.read()
                    kind, detail = check_answer(resp.status, raw, stream, chat, req.expected)
                except aiohttp.ClientPayloadError as exc:  # a cut chunked body
                    kind, detail = "truncated", repr(exc)
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    kind, detail = "error", repr(exc)
                report.add(kind, detail, stream)

        async def disruptor() -> None:
            n = 0
            while True:
                await asyncio.sleep(min(every_s, max(0.0, stop_at - time.monotonic())))
                if time.monotonic() >= stop_at:
                    if settle is not None:
                        await settle()
                    return
                await disrupt(n)
                n += 1
                report.disruptions = n

        chaos = asyncio.create_task(disruptor())
        try:
            await asyncio.gather(*(client() for _ in range(clients)))
            await chaos
        finally:
            chaos.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await chaos
    report.duration_s = time.monotonic() - t0
    return report


Answer = Callable[[list[int], int, int], list[int]]


def mixed_requests(
    model: str, answer: Answer, max_tokens: int = 40
) -> Callable[[int], ChaosRequest]:
    """Request i of a mix: half streamed, chat and completions alike, each with its own
    seed; `answer(prompt_ids, seed, max_tokens)` is the deterministic replica's answer
    (gpufleet.replica.generation.expected_answer), from which the expected text comes."""
    tok = default_tokenizer()

    def make(i: int) -> ChaosRequest:
        chat, stream = i % 4 in (0, 3), i % 2 == 0
        words = " ".join(
            tok.vocab[tok.first_word_id + (i * 7 + j) % 500] for j in range(12 + i % 9)
        )
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "seed": i,
                                "stream": stream}  # fmt: skip
        if chat:
            messages = [{"role": "user", "content": f"question {i} {words}"}]
            body["messages"] = messages
            prompt_ids = tok.encode(apply_chat_template(messages))
        else:
            body["prompt"] = f"story {i} {words}"
            prompt_ids = tok.encode(body["prompt"])
        if stream:
            body["stream_options"] = {"include_usage": True}
        text = tok.decode(answer(prompt_ids, i, max_tokens))
        path = "/v1/chat/completions" if chat else "/v1/completions"
        return ChaosRequest(path, body, Expected(text, len(prompt_ids), max_tokens))

    return make
