"""vLLM's request rules, checked on a corpus of valid and invalid bodies (no server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.replica.protocol import RequestError, parse_generation_request
from gpufleet.replica.testing import DEFAULT_MODEL
from gpufleet.tokenizer import default_tokenizer

CORPUS = json.loads((Path(__file__).parent / "data" / "request_corpus.json").read_text())
CASES = CORPUS["cases"]


def parse(case: dict[str, Any]) -> Any:
    return parse_generation_request(
        case["body"],
        kind=case["endpoint"],
        served_model_names=[DEFAULT_MODEL],
        max_model_len=8192,
        tokenizer=default_tokenizer(),
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_corpus(case: dict[str, Any]) -> None:
    if case["status"] == 200:
        parse(case)
        return
    with pytest.raises(RequestError) as info:
        parse(case)
    assert info.value.status == case["status"], info.value.message
    assert info.value.param == case["param"], info.value.message
    if case["param"]:
        # the message itself lets a person find the field too
        assert case["param"].split(".")[-1] in info.value.message


def test_corpus_covers_both_kinds() -> None:
    statuses = {(c["endpoint"], c["status"] == 200) for c in CASES}
    assert statuses == {
        ("chat", True),
        ("chat", False),
        ("completion", True),
        ("completion", False),
    }


def test_fields_change_what_is_generated() -> None:
    """Honoured, not just accepted: each field shows in the parsed parameters."""
    base = {"messages": [{"role": "user", "content": "a b c d"}]}

    def p(**kw: Any) -> Any:
        return parse({"endpoint": "chat", "body": {**base, **kw}})

    assert p(n=3).n == 3
    assert p(logprobs=True, top_logprobs=4).logprobs == 4
    assert p(logprobs=True).logprobs == 0
    assert p(logprobs=False, top_logprobs=0).logprobs is None
    assert p(response_format={"type": "json_object"}).output == "json"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert p(tools=tools).tool_choice == "auto"  # vLLM's default when tools are given
    named = p(tools=tools, tool_choice={"type": "function", "function": {"name": "f"}})
    assert (named.tool_choice, named.tool_name) == ("named", "f")
    assert p(stop_token_ids=[5]).stop_token_ids == [5]
    assert p(min_tokens=600, ignore_eos=False).stop_after_tokens == 600
    assert len(p(truncate_prompt_tokens=2).prompt_token_ids) == 2
    cont = p(
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "half"}],
        continue_final_message=True,
        add_generation_prompt=False,
    )
    assert cont.prompt_text is not None and cont.prompt_text.endswith("half ")


def test_max_logprobs_is_the_servers_setting() -> None:
    body = {"messages": [{"role": "user", "content": "a"}], "logprobs": True, "top_logprobs": 3}
    kw: dict[str, Any] = {"kind": "chat", "served_model_names": [DEFAULT_MODEL],
                          "max_model_len": 8192, "tokenizer": default_tokenizer()}  # fmt: skip
    assert parse_generation_request(body, **kw).logprobs == 3
    with pytest.raises(RequestError, match="max allowed: 2"):
        parse_generation_request(body, max_logprobs=2, **kw)
