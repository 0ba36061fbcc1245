"""The official openai SDK through every endpoint and parameter family, against a real
replica process: the SDK's own parsed types and exception classes must come out.

`compat_url` is the server under test (a replica here; tests/gateway reuses these checks
through the gateway).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import jsonschema
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel, Field

from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess
from gpufleet.tokenizer import default_tokenizer

pytestmark = pytest.mark.process  # starts processes and servers on loopback


@pytest.fixture(scope="module", params=["replica", "gateway"])
def compat_url(request: pytest.FixtureRequest, replica: ReplicaProcess) -> Iterator[str]:
    """The replica itself, and a real `gpufleet gateway` process in front of it."""
    if request.param == "replica":
        yield replica.url
        return
    cmd = [sys.executable, "-c", "from gpufleet.cli import main; main()", "gateway",
           "--port", "0", "--replica", replica.url, "--log-level", "WARNING"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        url = json.loads(proc.stdout.readline())["url"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the gateway has probed the replica ready
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
                if json.loads(resp.read())["data"]:
                    break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def client(compat_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=compat_url + "/v1", api_key="none", max_retries=0, timeout=30)


USER = [{"role": "user", "content": "tell me about the weather"}]


class Weather(BaseModel):
    city: str
    celsius: float = Field(ge=-60, le=60)
    conditions: list[str] = Field(min_length=1, max_length=3)
    windy: bool


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


def test_chat_and_usage(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=6, n=2, seed=4)
    assert isinstance(out, ChatCompletion)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].message.content != out.choices[1].message.content
    assert out.usage is not None and out.usage.completion_tokens == 12
    tok = default_tokenizer()
    assert all(tok.count(c.message.content or "") == 6 for c in out.choices)


def test_completion_stream_and_echo(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="one two", max_tokens=3, echo=True)
    assert isinstance(out, Completion) and out.choices[0].text.startswith("one two")
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="one two", max_tokens=4, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert all(isinstance(c, Completion) for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_stop(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, seed=2)
    words = (first.choices[0].message.content or "").split()
    out = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=8, seed=2, stop=[words[2]]
    )
    assert out.choices[0].finish_reason == "stop"
    assert (out.choices[0].message.content or "").split() == words[:2]


def test_chat_logprobs_stream_and_not(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=5, logprobs=True, top_logprobs=3, seed=1
    )
    lp = out.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 5
    assert "".join(t.token for t in lp.content) == out.choices[0].message.content
    for t in lp.content:
        assert t.logprob < 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and t.bytes == list(t.token.encode())
    streamed = []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=5, logprobs=True, top_logprobs=2, seed=1,
        stream=True,
    ):  # fmt: skip
        assert isinstance(chunk, ChatCompletionChunk)
        for ch in chunk.choices:
            if ch.logprobs is not None and ch.logprobs.content:
                streamed += ch.logprobs.content
    assert [t.token for t in streamed] == [t.token for t in lp.content]  # same seed
    assert [t.logprob for t in streamed] == [t.logprob for t in lp.content]


def test_completion_logprobs(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="a b c", max_tokens=4, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 4
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(4)]
    assert lp.top_logprobs is not None and all(len(d) == 2 for d in lp.top_logprobs)


def test_response_format_json_object_and_schema(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=USER, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(out.choices[0].message.content or ""), dict)
    assert out.choices[0].finish_reason == "stop"
    schema = Weather.model_json_schema()
    out = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)
    assert out.usage is not None
    assert out.usage.completion_tokens == default_tokenizer().count(
        out.choices[0].message.content or ""
    )


def test_sdk_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    for parse in (client.chat.completions.parse, client.beta.chat.completions.parse):
        out = parse(model=MODEL, messages=USER, response_format=Weather)
        parsed = out.choices[0].message.parsed
        assert isinstance(parsed, Weather) and -60 <= parsed.celsius <= 60


def test_structured_stream_is_valid_json(client: openai.OpenAI) -> None:
    text = ""
    for chunk in client.chat.completions.create(
        model=MODEL, messages=USER, stream=True,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "w", "schema": Weather.model_json_schema()}},
    ):  # fmt: skip
        for ch in chunk.choices:
            text += ch.delta.content or ""
    Weather.model_validate_json(text)


def test_tools_required_named_auto(client: openai.OpenAI) -> None:
    params = WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
    out = client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL], tool_choice="required"
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = (choice.message.tool_calls or [])[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), params)
    named = client.chat.completions.create(
        model=MODEL, messages=USER, tools=[TIME_TOOL, WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    assert named.choices[0].finish_reason == "stop"  # as vLLM (and OpenAI) for a named tool
    assert (named.choices[0].message.tool_calls or [])[0].function.name == "get_weather"
    # auto: a tool result comes back, the model answers in words
    follow = [
        *USER,
        {"role": "assistant", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=follow, tools=[WEATHER_TOOL], max_tokens=5
    )
    assert not answer.choices[0].message.tool_calls and answer.choices[0].message.content


def test_streamed_tool_call_deltas(client: openai.OpenAI) -> None:
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL], tool_choice="required", stream=True
    ):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                if d.id:
                    entry["id"] = d.id
                if d.function and d.function.name:
                    entry["name"] += d.function.name
                if d.function and d.function.arguments:
                    entry["arguments"] += d.function.arguments
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_TOOL["function"]["parameters"])  # type: ignore[index]


def test_sdk_stream_helper_assembles_strict_tool(client: openai.OpenAI) -> None:
    tool = openai.pydantic_function_tool(Weather, name="report")
    with client.chat.completions.stream(
        model=MODEL, messages=USER, tools=[tool], tool_choice="required"
    ) as stream:
        final = stream.get_final_completion()
    call = (final.choices[0].message.tool_calls or [])[0]
    assert isinstance(call.function.parsed_arguments, Weather)


def test_errors_are_the_sdk_exception_classes(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="nope", messages=USER)
    assert nf.value.param == "model" and str(nf.value.code) == "404"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=USER, logprobs=True, top_logprobs=50)
    assert bad.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as role:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "wizard", "content": "x"}],  # type: ignore[misc,list-item]
        )
    assert role.value.param == "messages.0.role"
    with pytest.raises(openai.NotFoundError):
        client.get("/nope", cast_to=object)
    with pytest.raises(openai.APIStatusError) as method:
        client.post("/models", cast_to=object)
    assert method.value.status_code == 405
    assert method.value.body["code"] == 405  # type: ignore[index]


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
