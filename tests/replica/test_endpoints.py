"""vLLM's side endpoints, /metrics, errors, startup, disconnects and fault injection."""

from __future__ import annotations

import asyncio
import os
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.replica.metrics import TTFT_BUCKETS_S
from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess
from gpufleet.tokenizer import default_tokenizer

pytestmark = pytest.mark.process  # every test here starts processes or servers


def scrape(text: str) -> dict[str, float]:
    """name{label=value,...} -> value, for every sample."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def key(name: str, **labels: str) -> str:
    merged = {"engine": "0", "model_name": MODEL, **labels}
    return name + "{" + ",".join(f"{k}={v}" for k, v in sorted(merged.items())) + "}"


async def test_metrics_have_vllm_names_labels_and_buckets(replica: ReplicaProcess) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "prompt": "a b c d", "max_tokens": 3}
        async with s.post(replica.url + "/v1/completions", json=body) as r:
            assert r.status == 200
        async with s.get(replica.url + "/metrics") as r:
            assert r.status == 200
            text = await r.text()
    m = scrape(text)
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert key(f"vllm:{gauge}") in m
    for counter in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions"):
        assert key(f"vllm:{counter}_total") in m
    assert m[key("vllm:prompt_tokens_total")] >= 4
    assert m[key("vllm:generation_tokens_total")] >= 3
    assert m[key("vllm:request_success_total", finished_reason="length")] >= 1
    assert any(k.startswith("vllm:cache_config_info{block_size=16,") for k in m)
    buckets = [
        float(k.split("le=")[1].split(",")[0].rstrip("}"))
        for k in m
        if k.startswith("vllm:time_to_first_token_seconds_bucket")
    ]
    assert sorted(b for b in buckets if b != float("inf")) == list(TTFT_BUCKETS_S)
    assert m[key("vllm:time_to_first_token_seconds_count")] >= 1
    for hist in (
        "inter_token_latency_seconds",
        "request_time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_inference_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "iteration_tokens_total",
    ):
        assert key(f"vllm:{hist}_count") in m
    assert m[key("vllm:request_generation_tokens_bucket", le="5.0")] >= 1  # 3 tokens


async def test_side_endpoints(replica: ReplicaProcess) -> None:
    tok = default_tokenizer()
    async with aiohttp.ClientSession() as s:
        async with s.get(replica.url + "/health") as r:
            assert r.status == 200 and await r.read() == b""
        async with s.get(replica.url + "/version") as r:
            assert "version" in await r.json()
        async with s.get(replica.url + "/load") as r:
            assert (await r.json())["server_load"] == 0
        async with s.post(replica.url + "/tokenize", json={"prompt": "x y z w"}) as r:
            data = await r.json()
            assert data["count"] == 4 and data["tokens"] == tok.encode("x y z w")
            assert data["max_model_len"] == 8192
        messages = [{"role": "user", "content": "hello there"}]
        async with s.post(replica.url + "/tokenize", json={"messages": messages}) as r:
            counted = (await r.json())["count"]
        body = {"model": MODEL, "messages": messages, "max_tokens": 1}
        async with s.post(replica.url + "/v1/chat/completions", json=body) as r:
            assert (await r.json())["usage"]["prompt_tokens"] == counted
        words = [tok.vocab[100], tok.vocab[2000]]
        ids = tok.encode(" ".join(words))
        async with s.post(replica.url + "/detokenize", json={"tokens": ids}) as r:
            assert (await r.json())["prompt"].split() == words


async def test_bad_requests_get_vllm_error_json(replica: ReplicaProcess) -> None:
    url = replica.url + "/v1/chat/completions"
    cases = [
        ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
         400, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
          "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
         400, "temperature"),
    ]  # fmt: skip
    async with aiohttp.ClientSession() as s:
        for body, status, param in cases:
            async with s.post(url, json=body) as r:
                assert r.status == status, body
                err = (await r.json())["error"]
                assert err["param"] == param and err["code"] == status and err["message"]
        async with s.post(
            url, data=b"{not json", headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["type"] == "BadRequestError"


async def test_disconnect_aborts_in_engine_at_once() -> None:
    # slow steps (50 ms) and a long answer: the client leaves after the first tokens
    with ReplicaProcess("--step-time", "base_s=0.05") as rep:
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": "a b", "max_tokens": 1000, "stream": True}
            async with s.post(rep.url + "/v1/completions", json=body) as r:
                await r.content.readline()
            # the response is closed: the replica must abort the request, not finish it
            deadline = time.monotonic() + 10
            while True:
                async with s.get(rep.url + "/metrics") as r:
                    m = scrape(await r.text())
                if m[key("vllm:request_success_total", finished_reason="abort")] == 1:
                    break
                assert time.monotonic() < deadline, "request was not aborted"
                await asyncio.sleep(0.05)
            assert m[key("vllm:num_requests_running")] == 0
            assert m[key("vllm:generation_tokens_total")] < 100


async def test_startup_health_and_faults() -> None:
    with ReplicaProcess("--startup-s", "1.0", "--step-time", "base_s=0.002") as rep:
        async with aiohttp.ClientSession() as s:
            async with s.get(rep.url + "/health") as r:
                assert r.status == 503
            body = {"model": MODEL, "prompt": "a", "max_tokens": 1}
            async with s.post(rep.url + "/v1/completions", json=body) as r:
                assert r.status == 503
            deadline = time.monotonic() + 15
            while True:
                async with s.get(rep.url + "/health") as r:
                    if r.status == 200:
                        break
                assert time.monotonic() < deadline, "never became healthy"
                await asyncio.sleep(0.1)
            # fail the next 2 requests with 429
            async with s.post(rep.url + "/admin/faults", json={"fail_next": 2, "fail_status": 429}):
                pass
            statuses = []
            for _ in range(3):
                async with s.post(rep.url + "/v1/completions", json=body) as r:
                    statuses.append(r.status)
                    if r.status != 200:
                        assert (await r.json())["error"]["code"] == 429
            assert statuses == [429, 429, 200]
            async with s.post(rep.url + "/admin/faults", json={"slow_factor": -1}) as r:
                assert r.status == 400
            async with s.post(rep.url + "/admin/faults", json={"unhealthy": True}) as r:
                assert (await r.json())["unhealthy"] is True
            async with s.get(rep.url + "/health") as r:
                assert r.status == 503
            async with s.post(rep.url + "/admin/faults", json={"exit": True, "exit_code": 3}):
                pass
        assert rep.proc.wait(timeout=10) == 3


async def test_sglang_info_endpoints_for_sglang_router(replica: ReplicaProcess) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(replica.url + "/get_model_info") as r:
            info = await r.json()
            assert info["served_model_name"] == MODEL
            # a local tokenizer directory a router can load without a model hub
            assert os.path.exists(os.path.join(info["model_path"], "tokenizer.json"))
        async with s.get(replica.url + "/get_server_info") as r:
            info = await r.json()
            assert info["context_length"] == 8192 and info["max_running_requests"] >= 1


async def test_kv_pressure_shows_in_metrics() -> None:
    # 64 blocks x 16 tokens of KV; 12 requests of 100 + 200 tokens need far more.
    flags = ("--step-time", "base_s=0.002", "--num-gpu-blocks-override", "64",
             "--max-model-len", "1024")  # fmt: skip
    with ReplicaProcess(*flags) as rep:
        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> int:
                body = {"model": MODEL, "prompt": " ".join(["w"] * 99 + [str(i)]),
                        "max_tokens": 200}  # fmt: skip
                async with s.post(rep.url + "/v1/completions", json=body) as r:
                    return int((await r.json())["usage"]["completion_tokens"])

            tasks = [asyncio.create_task(one(i)) for i in range(12)]
            peak_usage = peak_waiting = 0.0
            while not all(t.done() for t in tasks):
                async with s.get(rep.url + "/metrics") as r:
                    m = scrape(await r.text())
                peak_usage = max(peak_usage, m[key("vllm:kv_cache_usage_perc")])
                peak_waiting = max(peak_waiting, m[key("vllm:num_requests_waiting")])
                await asyncio.sleep(0.02)
            assert [t.result() for t in tasks] == [200] * 12
            async with s.get(rep.url + "/metrics") as r:
                m = scrape(await r.text())
    assert m[key("vllm:num_preemptions_total")] > 0
    assert peak_usage > 0.9 and peak_waiting > 0
    assert m[key("vllm:prefix_cache_hits_total")] > 0  # the shared 99-word prefix


async def test_http_1_0_client_gets_a_whole_stream(replica: ReplicaProcess) -> None:
    host, port = replica.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b'{"prompt": "a b", "max_tokens": 3, "stream": true}'
    writer.write(
        b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    data = await asyncio.wait_for(reader.read(), timeout=30)  # until the server closes
    writer.close()
    assert data.startswith(b"HTTP/1.0 200") or data.startswith(b"HTTP/1.1 200")
    assert data.count(b'"text":') == 3 and data.rstrip().endswith(b"data: [DONE]")
