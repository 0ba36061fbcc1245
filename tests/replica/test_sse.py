"""Pre-serialized SSE chunks are valid JSON with vLLM's fields."""

from __future__ import annotations

import json

from gpufleet.replica.sse import ChunkTemplates, escape


def parse(chunk: bytes) -> dict:
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    return json.loads(chunk[6:])


def test_chat_chunks() -> None:
    t = ChunkTemplates(
        chat=True, request_id="chatcmpl-1", created=7, model='m "q"', prompt_tokens=3,
        continuous_usage=True,
    )  # fmt: skip
    role = parse(t.role_chunk())
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    mid = parse(t.text_chunk(b" hi", 1))
    assert mid["model"] == 'm "q"' and mid["object"] == "chat.completion.chunk"
    assert mid["choices"][0]["delta"]["content"] == " hi"
    assert mid["usage"] == {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1}
    last = parse(t.text_chunk(escape('a "b"\n'), 2, "stop", "b"))
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["stop_reason"] == "b"
    assert last["choices"][0]["delta"]["content"] == 'a "b"\n'
    usage = parse(t.usage_chunk({"prompt_tokens": 3}))
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3}


def test_completion_hot_path_chunk_matches_text_chunk() -> None:
    t = ChunkTemplates(
        chat=False, request_id="cmpl-1", created=7, model="m", prompt_tokens=3,
        continuous_usage=False,
    )  # fmt: skip
    assert t.token_open + b" w" + t.token_close == t.text_chunk(b" w", 5)
    chunk = parse(t.text_chunk(b" w", 5))
    assert chunk["choices"][0]["text"] == " w" and "usage" not in chunk
