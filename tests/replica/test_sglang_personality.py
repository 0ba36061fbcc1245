"""`gpufleet replica --engine sglang`: SGLang's native endpoints, metric names, model cards
and error shape, over a real replica process."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import aiohttp
import pytest

from gpufleet.fleet_state import identify, parse_engine_metrics
from gpufleet.replica.testing import ReplicaProcess

pytestmark = pytest.mark.process  # every test here starts processes or servers


@pytest.fixture(scope="module")
def sglang() -> Iterator[ReplicaProcess]:
    with ReplicaProcess(
        "--engine", "sglang", "--enable-metrics", "--step-time", "base_s=0.002,per_token_s=1e-6"
    ) as r:
        yield r


async def _json(
    s: aiohttp.ClientSession, method: str, url: str, **kw: object
) -> tuple[int, object]:
    async with s.request(method, url, **kw) as r:  # type: ignore[arg-type]
        return r.status, await r.json(content_type=None)


async def test_generate_answers_sglangs_native_shape(sglang: ReplicaProcess) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 5}}
        status, out = await _json(s, "POST", sglang.url + "/generate", json=body)
        assert status == 200 and isinstance(out, dict)
        assert set(out) == {"text", "output_ids", "meta_info"}
        meta = out["meta_info"]
        assert len(out["output_ids"]) == meta["completion_tokens"] == 5
        assert meta["finish_reason"] == {"type": "length", "length": 5}
        assert meta["prompt_tokens"] == 5 and meta["e2e_latency"] > 0 and out["text"]
        # input_ids instead of text; PUT as SGLang allows; no max_new_tokens: at most 128
        body2 = {"input_ids": [1, 2, 3], "sampling_params": {"ignore_eos": True}}
        status, out2 = await _json(s, "PUT", sglang.url + "/generate", json=body2)
        assert status == 200 and isinstance(out2, dict)
        assert out2["meta_info"]["completion_tokens"] == 128


async def test_generate_streams_the_whole_text_so_far(sglang: ReplicaProcess) -> None:
    body = {"text": "a b c", "sampling_params": {"max_new_tokens": 6}, "stream": True,
            "rid": "req-1"}  # fmt: skip
    chunks: list[dict[str, object]] = []
    async with aiohttp.ClientSession() as s, s.post(sglang.url + "/generate", json=body) as r:
        assert r.status == 200 and r.content_type == "text/event-stream"
        raw = (await r.read()).decode()
    events = [e.removeprefix("data: ") for e in raw.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [str(c["text"]) for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # cumulative
    metas = [c["meta_info"] for c in chunks]
    assert all(m["id"] == "req-1" for m in metas)  # type: ignore[index]
    assert all(m["finish_reason"] is None for m in metas[:-1])  # type: ignore[index]
    assert metas[-1]["finish_reason"] == {"type": "length", "length": 6}  # type: ignore[index]
    assert len(chunks[-1]["output_ids"]) == 6  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"sampling_params": {"max_new_tokens": 2}}, "Either text or input_ids"),
        ({"text": "a", "sampling_params": {"max_new_tokenz": 2}}, "max_new_tokenz"),
        ({"text": "a", "sampling_params": {"regex": "x+"}}, "regex"),
        ({"text": ["a", "b"]}, "one prompt"),
    ],
)
async def test_generate_refuses_what_it_cannot_do(
    sglang: ReplicaProcess, body: dict[str, object], says: str
) -> None:
    async with aiohttp.ClientSession() as s:
        status, out = await _json(s, "POST", sglang.url + "/generate", json=body)
    assert status == 400 and isinstance(out, dict) and says in out["error"]["message"]


async def test_cards_info_and_errors_are_sglangs(sglang: ReplicaProcess) -> None:
    async with aiohttp.ClientSession() as s:
        _, models = await _json(s, "GET", sglang.url + "/v1/models")
        assert isinstance(models, dict)
        assert models["data"][0]["owned_by"] == "sglang" and "permission" not in models["data"][0]
        _, server_info = await _json(s, "GET", sglang.url + "/get_server_info")
        _, model_info = await _json(s, "GET", sglang.url + "/get_model_info")
        assert (
            identify(server_info=server_info).describe() == "sglang 0.5.10, from /get_server_info"
        )
        assert isinstance(model_info, dict) and model_info["weight_version"] == "default"
        for path in ("/version", "/load"):  # SGLang has neither
            async with s.get(sglang.url + path) as r:
                assert r.status == 404
        status, err = await _json(s, "POST", sglang.url + "/v1/completions",
                                  json={"model": "nope", "prompt": "a"})  # fmt: skip
        assert status == 404
        assert err == {"object": "error", "message": "The model `nope` does not exist.",
                       "type": "NotFoundError", "param": "model", "code": 404}  # fmt: skip


async def test_metrics_health_generate_and_flush_cache(sglang: ReplicaProcess) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(sglang.url + "/health_generate") as r:
            assert r.status == 200
        async with s.get(sglang.url + "/metrics") as r:
            text = await r.text()
        assert "sglang:num_running_reqs{" in text and "vllm:" not in text
        scraped = parse_engine_metrics(text)
        assert scraped.engine == "sglang" and scraped.load_reported
        assert scraped.kv_capacity_tokens and scraped.kv_capacity_tokens > 0
        long = {"text": "x", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
                "stream": True}  # fmt: skip
        async with s.post(sglang.url + "/generate", json=long) as running:
            await running.content.readline()  # it is in the engine
            async with s.post(sglang.url + "/flush_cache") as r:
                assert r.status == 400  # refused while a request runs
            async with s.get(sglang.url + "/metrics") as r:
                busy = parse_engine_metrics(await r.text())
            assert busy.num_running == 1
            await running.read()
        async with s.get(sglang.url + "/flush_cache") as r:
            assert r.status == 200 and (await r.text()).startswith("Cache flushed.")


async def test_without_enable_metrics_there_is_no_metrics_endpoint() -> None:
    with ReplicaProcess("--engine", "sglang", "--step-time", "base_s=0.002") as r:
        async with aiohttp.ClientSession() as s, s.get(r.url + "/metrics") as resp:
            assert resp.status == 404
