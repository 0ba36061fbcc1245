"""The official openai client, unmodified, against a real replica subprocess."""

from __future__ import annotations

import openai
import pytest

from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess
from gpufleet.tokenizer import apply_chat_template, default_tokenizer

pytestmark = pytest.mark.process  # every test here starts processes or servers


def client(replica: ReplicaProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=replica.url + "/v1", api_key="none", max_retries=0, timeout=30)


def aclient(replica: ReplicaProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=replica.url + "/v1", api_key="none", max_retries=0, timeout=30
    )


def test_models_lists_served_model_with_max_model_len(replica: ReplicaProcess) -> None:
    models = client(replica).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].model_extra is not None
    assert models.data[0].model_extra["max_model_len"] == 8192


def test_completion_non_stream_usage_matches_tokenizer(replica: ReplicaProcess) -> None:
    tok = default_tokenizer()
    prompt = "the quick brown fox jumps over the lazy dog"
    out = client(replica).completions.create(model=MODEL, prompt=prompt, max_tokens=12)
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert out.usage is not None
    assert out.usage.prompt_tokens == tok.count(prompt)
    assert out.usage.completion_tokens == 12 == tok.count(choice.text)
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_chat_non_stream(replica: ReplicaProcess) -> None:
    tok = default_tokenizer()
    messages = [
        {"role": "system", "content": "you are terse"},
        {"role": "user", "content": "say something"},
    ]
    out = client(replica).chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=7, temperature=0.7, seed=3
    )
    assert out.choices[0].message.role == "assistant"
    assert tok.count(out.choices[0].message.content or "") == 7
    assert out.usage is not None
    assert out.usage.prompt_tokens == tok.count(apply_chat_template(messages))
    again = client(replica).chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=7, seed=3
    )
    assert again.choices[0].message.content == out.choices[0].message.content  # same seed


def test_chat_stream_with_usage_and_cached_tokens(replica: ReplicaProcess) -> None:
    tok = default_tokenizer()
    shared = " ".join(f"w{i}" for i in range(64))  # 64+ tokens: several full 16-token blocks
    messages = [{"role": "user", "content": shared}]
    c = client(replica)
    c.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)  # warm the cache
    stream = c.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    finish = None
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 9 == tok.count(text)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // 16 * 16


def test_completion_stream_continuous_usage(replica: ReplicaProcess) -> None:
    stream = client(replica).completions.create(
        model=MODEL,
        prompt="alpha beta gamma",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    counts = [chunk.usage.completion_tokens for chunk in stream if chunk.usage is not None]
    assert counts[-1] == 5
    assert counts == sorted(counts)


async def test_async_client_stream_and_not(replica: ReplicaProcess) -> None:
    c = aclient(replica)
    out = await c.completions.create(model=MODEL, prompt="one two three", max_tokens=4)
    assert out.usage is not None and out.usage.completion_tokens == 4
    stream = await c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
    )
    pieces = [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]
    assert default_tokenizer().count("".join(pieces)) == 6
    await c.close()


def test_errors_are_openai_errors(replica: ReplicaProcess) -> None:
    c = client(replica)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="x", max_tokens=1, logprobs=50)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        c.completions.create(model=MODEL, prompt="x " * 9000, max_tokens=1)


def test_stop_string_ends_with_stop(replica: ReplicaProcess) -> None:
    c = client(replica)
    first = c.completions.create(model=MODEL, prompt="a b c", max_tokens=6, seed=11)
    words = first.choices[0].text.split()
    out = c.completions.create(model=MODEL, prompt="a b c", max_tokens=6, seed=11, stop=[words[3]])
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text.split() == words[:3]


def test_stream_stop_string_never_leaks(replica: ReplicaProcess) -> None:
    c = client(replica)
    first = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "q"}], max_tokens=8, seed=5
    )
    words = (first.choices[0].message.content or "").split()
    stop = f"{words[4]} {words[5]}"  # spans two tokens
    stream = c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "q"}],
        max_tokens=8,
        seed=5,
        stop=stop,
        stream=True,
    )
    text = ""
    finish = None
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert finish == "stop"
    assert text.split() == words[:4]
