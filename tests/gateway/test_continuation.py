"""The pure half of mid-stream failover: what the client got, the request that continues
it, and the continuation rewritten to fit (no sockets)."""

from __future__ import annotations

import json
from typing import Any

from gpufleet.gateway.continuation import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    Finished,
    Splicer,
    StreamState,
    Transcript,
    continuation_body,
    event_boundary,
)


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


def chat_chunk(content: str | None = None, role: bool = False, finish: str | None = None,
               cid: str = "chatcmpl-1", usage: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
        delta["content"] = ""
    if content is not None:
        delta["content"] = content
    out: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": 5,
                           "model": "m", "choices": [{"index": 0, "delta": delta,
                                                      "finish_reason": finish}]}  # fmt: skip
    if usage is not None:
        out["usage"] = usage
    return out


def text_chunk(text: str, finish: str | None = None, cid: str = "cmpl-1") -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": 5, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}  # fmt: skip


def test_event_boundary_keeps_whole_events_only() -> None:
    assert event_boundary(b"data: a\n\ndata: b") == len(b"data: a\n\n")
    assert event_boundary(b"data: a\r\n\r\ndata: b\r\n\r\n") == len(
        b"data: a\r\n\r\ndata: b\r\n\r\n"
    )
    assert event_boundary(b"data: partial") == 0


def test_transcript_reads_back_what_the_client_got() -> None:
    t = Transcript(chat=True)
    t.add(sse(chat_chunk(role=True), chat_chunk(" a"), chat_chunk(" b")))
    t.add(sse(chat_chunk(" c")))
    state = t.state()
    assert (state.id, state.created, state.text, state.tokens) == ("chatcmpl-1", 5, " a b c", 3)
    assert state.role_sent and state.finish_reason is None and not state.done
    t.add(sse(chat_chunk(finish="stop"), "[DONE]"))
    assert t.state().finish_reason == "stop" and t.state().done
    # Folding many events into text keeps the same reading.
    big = Transcript(chat=False)
    for i in range(3000):
        big.add(sse(text_chunk(f" w{i}")))
    assert big.state().tokens == 3000 and big.state().text.endswith(" w2999")


def test_chat_continuation_follows_the_dialect() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True,
            "max_tokens": 10, "seed": 3}  # fmt: skip
    state = StreamState(chat=True, text=" a b c", tokens=3)
    vllm = continuation_body(body, True, state, "vllm")
    assert isinstance(vllm, dict)
    assert vllm["messages"][-1] == {"role": "assistant", "content": " a b c"}
    assert vllm["continue_final_message"] is True and vllm["add_generation_prompt"] is False
    assert vllm["max_tokens"] == 7 and vllm["seed"] == 3 and body["max_tokens"] == 10
    sglang = continuation_body(body, True, state, "sglang")
    assert isinstance(sglang, dict) and "add_generation_prompt" not in sglang
    assert sglang["continue_final_message"] is True
    assert isinstance(continuation_body(body, True, state, "none"), str)
    # Nothing generated reached the client yet: the original request goes again, as is.
    assert continuation_body(body, True, StreamState(chat=True), "none") is body
    # Without max_tokens a chat answer ends where the model ends it.
    open_ended = continuation_body({**body, "max_tokens": None}, True, state, "vllm")
    assert isinstance(open_ended, dict) and open_ended["max_tokens"] is None


def test_completion_continuation_appends_the_text_and_counts_down() -> None:
    body = {"model": "m", "prompt": "once", "stream": True, "echo": True}
    state = StreamState(chat=False, text=" upon a", tokens=2)
    out = continuation_body(body, False, state, "vllm")
    assert isinstance(out, dict)
    assert out["prompt"] == "once upon a" and "echo" not in out
    assert out["max_tokens"] == COMPLETIONS_DEFAULT_MAX_TOKENS - 2
    assert isinstance(continuation_body({**body, "prompt": [1, 2]}, False, state, "vllm"), str)
    done = continuation_body({**body, "max_tokens": 2}, False, state, "vllm")
    assert isinstance(done, Finished) and done.finish_reason == "length"


def test_what_cannot_be_continued() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True}
    partial = StreamState(chat=True, text=" a", tokens=1)
    assert isinstance(continuation_body({**body, "n": 2}, True, partial, "vllm"), str)
    assert isinstance(continuation_body({**body, "response_format": {"type": "json_object"}},
                                        True, partial, "vllm"), str)  # fmt: skip
    tools = StreamState(chat=True, uncontinuable="the answer holds tool calls")
    assert isinstance(continuation_body(body, True, tools, "vllm"), str)
    finished = StreamState(chat=True, text=" a", tokens=1, finish_reason="stop")
    assert isinstance(continuation_body(body, True, finished, "vllm"), Finished)


def test_splicer_makes_the_continuation_read_as_the_rest() -> None:
    state = StreamState(chat=True, id="chatcmpl-first", created=5, text=" a b", tokens=2)
    splice = Splicer(state)
    second = sse(
        chat_chunk(role=True, cid="chatcmpl-second"),
        chat_chunk(" c", cid="chatcmpl-second"),
        chat_chunk(" d", finish="length", cid="chatcmpl-second"),
        {"id": "chatcmpl-second", "object": "chat.completion.chunk", "created": 9, "model": "m",
         "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2,
                                  "total_tokens": 14}},
        "[DONE]",
    )  # fmt: skip
    out = splice.rewrite(second)
    blocks = [b for b in out.split(b"\n\n") if b]
    assert blocks[-1] == b"data: [DONE]"
    events = [json.loads(b[6:]) for b in blocks[:-1]]
    assert len(events) == 3  # the second role chunk is gone
    assert {e["id"] for e in events} == {"chatcmpl-first"}
    assert {e["created"] for e in events} == {5}
    assert [e["choices"][0]["delta"] for e in events[:2]] == [{"content": " c"}, {"content": " d"}]
    # The original prompt was 10 tokens: the continuation's prompt held the 2 sent tokens.
    assert events[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4,
                                   "total_tokens": 14}  # fmt: skip


def test_metrics_survive_a_model_name_with_a_lone_surrogate() -> None:
    """A client's model name reached a label and broke /metrics for good (fuzz corpus)."""
    from prometheus_client import generate_latest

    from gpufleet.fleet_state import LatencyWindows
    from gpufleet.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics(lambda: [], lambda: 0, LatencyWindows(60.0))
    metrics.count_request("m\ud800", "t", 200)
    metrics.latency("m\udfff", "t")[0].observe(0.1)
    metrics.count_resume("m\ud800", "stall", 3)
    assert b"gpufleet_gateway_requests_total" in generate_latest(metrics.registry)
