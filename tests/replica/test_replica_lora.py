"""LoRA on a real `gpufleet replica`: --enable-lora flags, vLLM's dynamic-LoRA endpoints,
adapter cards in /v1/models and vllm:lora_requests_info."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.errors import UserError
from gpufleet.replica.lora import parse_lora_modules, runtime_updates_allowed
from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess

FAST = ("--step-time", "base_s=0.002,per_token_s=1e-6")


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sql-lora")
    (d / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    return d


@pytest.fixture(scope="module")
def lora_replica(adapter_dir: Path) -> Iterator[ReplicaProcess]:
    args = (*FAST, "--enable-lora", "--max-loras", "2", "--lora-modules", f"sql={adapter_dir}")
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with ReplicaProcess(*args, env=env) as r:
        yield r


def lora_info(text: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm:lora_requests_info"
    ]


def test_lora_modules_forms() -> None:
    mods = parse_lora_modules(["a=/x", '{"name": "b", "path": "org/b", "base_model_name": "M"}'])
    assert [(m.name, m.path, m.base_model_name) for m in mods] == [
        ("a", "/x", None),
        ("b", "org/b", "M"),
    ]
    for bad in (["nopath"], ["a=/x", "a=/y"], ['{"name": "c"}']):
        with pytest.raises(UserError):
            parse_lora_modules(bad)
    assert runtime_updates_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    assert not runtime_updates_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"})
    assert not runtime_updates_allowed({})


@pytest.mark.process
async def test_adapters_served_listed_and_metered(
    lora_replica: ReplicaProcess, adapter_dir: Path
) -> None:
    url = lora_replica.url
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/v1/models") as r:
            cards = {c["id"]: c for c in (await r.json())["data"]}
        assert cards["sql"]["parent"] == MODEL and cards["sql"]["root"] == str(adapter_dir)
        assert "parent" not in cards[MODEL] or cards[MODEL]["parent"] is None
        body = {"model": "sql", "prompt": "select a b c", "max_tokens": 3}
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["model"] == "sql"
        async with s.post(url + "/v1/completions", json={**body, "model": "nope"}) as r:
            assert r.status == 404
        async with s.get(url + "/metrics") as r:
            samples = lora_info(await r.text())
    assert samples, "vllm:lora_requests_info missing with --enable-lora"
    labels, value = max(samples, key=lambda lv: lv[1])  # the newest line is the state now
    assert labels["max_lora"] == "2"
    assert set(labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert value > 1e9  # a wall time, as vLLM sets it


@pytest.mark.process
async def test_runtime_load_and_unload(lora_replica: ReplicaProcess) -> None:
    url = lora_replica.url
    async with aiohttp.ClientSession() as s:
        load = {"lora_name": "chat", "lora_path": "org/chat-lora"}
        async with s.post(url + "/v1/load_lora_adapter", json=load) as r:
            assert r.status == 200, await r.text()
        async with s.post(url + "/v1/load_lora_adapter", json=load) as r:
            assert r.status == 400 and "already been loaded" in await r.text()
        missing = {"lora_name": "x", "lora_path": "/no/such/adapter"}
        async with s.post(url + "/v1/load_lora_adapter", json=missing) as r:
            assert r.status == 404
        async with s.post(url + "/v1/load_lora_adapter", json={"lora_name": "y"}) as r:
            assert r.status == 400
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
        async with s.get(url + "/v1/models") as r:
            assert "chat" in {c["id"] for c in (await r.json())["data"]}
        async with s.post(url + "/v1/unload_lora_adapter", json={"lora_name": "chat"}) as r:
            assert r.status == 200
        async with s.post(url + "/v1/unload_lora_adapter", json={"lora_name": "chat"}) as r:
            assert r.status == 404
        async with s.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 404


@pytest.mark.process
async def test_no_runtime_updates_without_the_env() -> None:
    with ReplicaProcess(*FAST, "--enable-lora", "--lora-modules", "sql=org/sql") as rep:
        async with aiohttp.ClientSession() as s:
            load = {"lora_name": "chat", "lora_path": "org/chat"}
            async with s.post(rep.url + "/v1/load_lora_adapter", json=load) as r:
                assert r.status == 404  # the route does not exist, as in vLLM
            async with s.get(rep.url + "/v1/models") as r:
                assert "sql" in {c["id"] for c in (await r.json())["data"]}


@pytest.mark.process
async def test_sglang_personality_loads_adapters_its_way() -> None:
    """SGLang's routes (no environment switch), its JSON answers (LoadLoRAAdapterReqOutput,
    400 on failure), `<base>:<adapter>` on the OpenAI routes and `lora_path` on /generate."""
    args = (*FAST, "--engine", "sglang", "--enable-lora", "--max-loras", "2")
    with ReplicaProcess(*args) as rep:
        url = rep.url
        async with aiohttp.ClientSession() as s:
            load = {"lora_name": "chat", "lora_path": "org/chat-lora"}
            async with s.post(url + "/v1/load_lora_adapter", json=load) as r:
                assert r.status == 404  # vLLM's route is not SGLang's
            async with s.post(url + "/load_lora_adapter", json=load) as r:
                assert r.status == 200, await r.text()
                out = await r.json()
            assert out == {"success": True, "error_message": None,
                           "loaded_adapters": {"chat": "org/chat-lora"}}  # fmt: skip
            async with s.post(url + "/load_lora_adapter", json=load) as r:
                again = await r.json()
            assert r.status == 400 and again["success"] is False
            assert "already" in again["error_message"]
            for model in (f"{MODEL}:chat", "chat"):
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 2}  # fmt: skip
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()
            gen = {
                "text": "hi there",
                "lora_path": "chat",
                "sampling_params": {"max_new_tokens": 2},
            }
            async with s.post(url + "/generate", json=gen) as r:
                assert r.status == 200, await r.text()
            async with s.post(url + "/generate", json={**gen, "lora_path": "nope"}) as r:
                assert r.status == 400
            async with s.post(url + "/unload_lora_adapter", json={"lora_name": "chat"}) as r:
                assert r.status == 200 and (await r.json())["loaded_adapters"] == {}
            async with s.post(url + "/unload_lora_adapter", json={"lora_name": "chat"}) as r:
                assert r.status == 400 and (await r.json())["success"] is False
            body = {"model": f"{MODEL}:chat", "prompt": "a b", "max_tokens": 2}
            async with s.post(url + "/v1/completions", json=body) as r:
                assert r.status == 404
