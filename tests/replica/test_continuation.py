"""Continuing a partial answer gives the rest of the same answer (what a gateway's
mid-stream failover relies on): chat with `continue_final_message` and
`add_generation_prompt: false` as vLLM takes them, completions with the text so far
appended to the prompt."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess
from gpufleet.tokenizer import default_tokenizer

pytestmark = pytest.mark.process  # every test here starts processes or servers

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go on then"}]


class Answer:
    def __init__(self, status_code: int, text: str) -> None:
        self.status_code = status_code
        self.text = text

    def json(self) -> Any:
        return json.loads(self.text)


def _post(replica: ReplicaProcess, path: str, body: dict[str, Any]) -> Answer:
    data = json.dumps({"model": MODEL, **body}).encode()
    req = urllib.request.Request(replica.url + path, data=data,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return Answer(resp.status, resp.read().decode())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read().decode())


def _streamed(replica: ReplicaProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    answer = _post(replica, path, {"stream": True, **body})
    assert answer.status_code == 200
    return [json.loads(block[6:]) for block in answer.text.split("\n\n")
            if block.startswith("data: ") and block != "data: [DONE]"]  # fmt: skip


@pytest.mark.parametrize("max_tokens", [None, 40])
def test_chat_continuation_is_the_rest_of_the_answer(
    replica: ReplicaProcess, max_tokens: int | None
) -> None:
    limit = {} if max_tokens is None else {"max_tokens": max_tokens}
    full = _post(replica, "/v1/chat/completions", {"messages": MESSAGES, "seed": 9, **limit})
    answer = full.json()["choices"][0]["message"]["content"]
    words = answer.split()
    usage = full.json()["usage"]
    assert len(words) == usage["completion_tokens"] > 12
    k = 7
    partial = "".join(" " + w for w in words[:k])
    rest = {"max_tokens": max_tokens - k} if max_tokens else {}
    cont = _post(replica, "/v1/chat/completions", {
        "messages": [*MESSAGES, {"role": "assistant", "content": partial}],
        "continue_final_message": True, "add_generation_prompt": False, "seed": 9, **rest,
    })  # fmt: skip
    body = cont.json()
    assert partial + body["choices"][0]["message"]["content"] == answer
    assert body["choices"][0]["finish_reason"] == full.json()["choices"][0]["finish_reason"]
    assert body["usage"]["prompt_tokens"] == usage["prompt_tokens"] + k
    assert body["usage"]["completion_tokens"] == usage["completion_tokens"] - k


def test_completion_continuation_is_the_rest_of_the_answer(replica: ReplicaProcess) -> None:
    prompt = "once upon a time"
    full = _streamed(replica, "/v1/completions", {"prompt": prompt, "max_tokens": 30, "seed": 4})
    pieces = [e["choices"][0]["text"] for e in full]
    assert len(pieces) == 30 and all(len(p.split()) == 1 for p in pieces)  # a token an event
    k = 11
    cont = _streamed(replica, "/v1/completions",
                     {"prompt": prompt + "".join(pieces[:k]), "max_tokens": 30 - k, "seed": 4})  # fmt: skip
    assert [e["choices"][0]["text"] for e in cont] == pieces[k:]
    assert cont[-1]["choices"][0]["finish_reason"] == "length"


def test_another_seed_or_prompt_gives_another_answer(replica: ReplicaProcess) -> None:
    def text(body: dict[str, Any]) -> str:
        out = _post(replica, "/v1/completions", {"max_tokens": 12, **body})
        return str(out.json()["choices"][0]["text"])

    base = text({"prompt": "a b c", "seed": 1})
    assert base == text({"prompt": "a b c", "seed": 1})
    assert base != text({"prompt": "a b c", "seed": 2})
    assert base != text({"prompt": "a b d", "seed": 1})


def test_continuation_options_are_checked_as_vllm_does(replica: ReplicaProcess) -> None:
    both = _post(replica, "/v1/chat/completions", {
        "messages": [*MESSAGES, {"role": "assistant", "content": "so"}],
        "continue_final_message": True, "add_generation_prompt": True,
    })  # fmt: skip
    assert both.status_code == 400
    assert both.json()["error"]["param"] == "continue_final_message"
    not_assistant = _post(replica, "/v1/chat/completions", {
        "messages": MESSAGES, "continue_final_message": True, "add_generation_prompt": False,
    })  # fmt: skip
    assert not_assistant.status_code == 400
    # The prompt of a continuation is the original prompt plus the partial answer.
    tok = default_tokenizer()
    out = _post(replica, "/v1/chat/completions", {
        "messages": [*MESSAGES, {"role": "assistant", "content": " la la"}],
        "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 1,
    })  # fmt: skip
    plain = _post(replica, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1})
    assert out.json()["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"] + 2
    assert tok.count(" la la") == 2
