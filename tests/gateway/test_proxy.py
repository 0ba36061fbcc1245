"""The gateway in front of in-process stub backends: pass-through, streaming, errors."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from .conftest import Front, GatewayFactory, wait_until
from .stub_backend import StubBackend

pytestmark = pytest.mark.process  # every test here starts processes or servers

MSG = [{"role": "user", "content": "hello there"}]


def assert_openai_error(body: dict, status: int) -> None:
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["code"] == status  # vLLM's shape: the HTTP status, an integer


async def test_openai_async_client_chat_and_completions(
    stubs: list[StubBackend], make_gateway: GatewayFactory, front: Front
) -> None:
    gw = await make_gateway([s.url for s in stubs])
    async with front.openai_async(gw) as client:
        chat = await client.chat.completions.create(model="stub-model", messages=MSG)  # type: ignore[arg-type]
        assert chat.choices[0].message.content == "w0 w1 w2 w3 w4"
        stream = await client.chat.completions.create(
            model="stub-model",
            messages=MSG,  # type: ignore[arg-type]
            stream=True,
        )
        parts = [c.choices[0].delta.content async for c in stream]
        assert "".join(p or "" for p in parts) == " w0 w1 w2 w3 w4"
        comp = await client.completions.create(model="stub-model", prompt="hi")
        assert comp.choices[0].text == "w0 w1 w2 w3 w4"
        cstream = await client.completions.create(model="stub-model", prompt="hi", stream=True)
        texts = [c.choices[0].text async for c in cstream]
        assert "".join(texts) == " w0 w1 w2 w3 w4"
        models = await client.models.list()
        assert [m.id for m in models.data] == ["stub-model"]
    # Round robin spread the four requests over both replicas.
    assert all(len(s.received) == 2 for s in stubs)


async def test_openai_sync_client(
    stubs: list[StubBackend], make_gateway: GatewayFactory, front: Front
) -> None:
    gw = await make_gateway([s.url for s in stubs])

    def call() -> tuple[str, str]:
        client = front.openai_sync(gw)
        with client:
            full = client.chat.completions.create(model="stub-model", messages=MSG)  # type: ignore[arg-type]
            stream = client.chat.completions.create(
                model="stub-model",
                messages=MSG,  # type: ignore[arg-type]
                stream=True,
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream)
            return full.choices[0].message.content or "", text

    full, streamed = await asyncio.to_thread(call)
    assert full == "w0 w1 w2 w3 w4"
    assert streamed == " w0 w1 w2 w3 w4"


async def test_body_forwarded_byte_for_byte(
    stubs: list[StubBackend], make_gateway: GatewayFactory, front: Front
) -> None:
    gw = await make_gateway([stubs[0].url])
    # Odd spacing, key order, unknown fields and unicode must all survive untouched.
    raw = (
        b'{ "messages":[{"role":"user","content":"caf\\u00e9 \xe2\x98\x95"}],\n'
        b'  "model" : "stub-model", "vendor_extension": {"x": [1, 2.50, null]},'
        b' "stream": false }'
    )
    async with (
        front.session(gw) as session,
        session.post(
            gw.url + "/v1/chat/completions",
            data=raw,
            headers={"Content-Type": "application/json", "X-Custom": "kept"},
        ) as resp,
    ):
        assert resp.status == 200
        body = await resp.json()
    assert body["served_by"] == "s0"
    assert stubs[0].received == [raw]
    assert stubs[0].received_headers[0]["X-Custom"] == "kept"


async def test_bad_requests_get_openai_errors(
    stubs: list[StubBackend], make_gateway: GatewayFactory, front: Front
) -> None:
    gw = await make_gateway([stubs[0].url])
    url = gw.url + "/v1/chat/completions"
    cases = [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (json.dumps({"model": 7, "messages": MSG}).encode(), 400, "model"),
        (json.dumps({"model": "stub-model", "messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"model": "stub-model", "messages": MSG, "stream": "yes"}).encode(), 400,
         "stream"),
        (json.dumps({"messages": MSG}).encode(), 400, "model"),
        (json.dumps({"model": "nope", "messages": MSG}).encode(), 404, "model"),
    ]  # fmt: skip
    async with front.session(gw) as session:
        for raw, status, param in cases:
            async with session.post(url, data=raw) as resp:
                assert resp.status == status, raw
                assert resp.content_type == "application/json"
                body = await resp.json()
                assert_openai_error(body, status)
                assert body["error"]["param"] == param
        ten_mb = b'{"model": "stub-model", "prompt": "' + b"a" * (10 * 1024 * 1024) + b'"}'
        async with session.post(gw.url + "/v1/completions", data=ten_mb) as resp:
            assert resp.status == 413
            assert_openai_error(await resp.json(), 413)
        async with session.get(url) as resp:
            assert resp.status == 405
            assert_openai_error(await resp.json(), 405)
        async with session.get(gw.url + "/v2/nothing") as resp:
            assert resp.status == 404
            assert_openai_error(await resp.json(), 404)
        big_header = {f"X-Big-{i}": "x" * 6000 for i in range(3)}  # 18 KB > 16 KB
        async with session.post(url, data=b"{}", headers=big_header) as resp:
            assert resp.status == 431
            assert_openai_error(await resp.json(), 431)
    # None of the refused requests reached the replica.
    assert stubs[0].received == []


async def test_openai_client_sees_not_found_for_unknown_model(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([stubs[0].url])
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.NotFoundError) as info:
            await client.chat.completions.create(model="missing", messages=MSG)  # type: ignore[arg-type]
        assert info.value.status_code == 404
    finally:
        await client.close()


async def test_models_union_and_model_aware_routing(make_gateway: GatewayFactory) -> None:
    a = await StubBackend("a", models=("model-a",)).start()
    b = await StubBackend("b", models=("model-b", "shared")).start()
    c = await StubBackend("c", models=("shared",)).start()
    try:
        gw = await make_gateway([a.url, b.url, c.url])
        async with aiohttp.ClientSession() as session:
            async with session.get(gw.url + "/v1/models") as resp:
                ids = [m["id"] for m in (await resp.json())["data"]]
            assert ids == ["model-a", "model-b", "shared"]
            for _ in range(6):
                for model in ("model-a", "shared"):
                    body = {"model": model, "messages": MSG}
                    async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200
        assert len(a.received) == 6
        assert all(json.loads(r)["model"] == "model-a" for r in a.received)
        assert all(json.loads(r)["model"] == "shared" for r in b.received + c.received)
        assert len(b.received) + len(c.received) == 6
    finally:
        for s in (a, b, c):
            await s.stop()


async def test_retry_before_first_byte_on_5xx(
    stubs: list[StubBackend], make_gateway: GatewayFactory, front: Front
) -> None:
    gw = await make_gateway([s.url for s in stubs], health={"eject_after_failures": 100})
    stubs[0].fail_status = 500
    async with front.session(gw) as session:
        for stream in (False, True, False, True):
            body = {"model": "stub-model", "messages": MSG, "stream": stream}
            async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                text = await resp.text()
                assert "error" not in text
    assert len(stubs[0].received) >= 1  # round robin did send some there first
    assert len(stubs[1].received) == 4
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/metrics") as resp:
        metrics = await resp.text()
    assert f'gpufleet_gateway_replica_retries_total{{replica="{gw.list_replicas()[0]["id"]}"}}' in (
        metrics
    )


async def test_requests_routed_to_ready_replicas_count_as_admitted(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    """The autoscaler's arrival rate counts every request the gateway admits, the ones
    routed straight to a ready replica too (only the queue's admissions were counted, so
    `gpufleet up` sized on no arrivals while the simulator, which admits every request
    through the fleet core, sized by Little's law); a retried request counts once."""
    gw = await make_gateway([s.url for s in stubs], health={"eject_after_failures": 100})
    stubs[0].fail_status = 500
    async with aiohttp.ClientSession() as session:
        for stream in (False, True, False):
            body = {"model": "stub-model", "messages": MSG, "stream": stream}
            async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
    assert len(stubs[0].received) >= 1  # a retry did happen
    signals = gw.signals()
    assert signals.admitted_total == 3
    assert signals.admitted_total_by_model == {"stub-model": 3}
    assert signals.admitted_in_window == 3


async def test_a_streams_usage_gives_the_signals_their_prompt_and_output_tokens(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    """The autoscaler's capacity in work weighs prompt and output tokens apart: the gateway
    reads both from a stream's usage (it does not tokenize), and counts none without it."""
    gw = await make_gateway([s.url for s in stubs])
    async with aiohttp.ClientSession() as session:
        for usage in (False, True):
            body = {"model": "stub-model", "messages": MSG, "stream": True,
                    "stream_options": {"include_usage": usage}}  # fmt: skip
            async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
            signals = gw.signals()
            if not usage:
                assert signals.tokens_per_request is None
    chunks = stubs[0].chunks
    assert signals.tokens_per_request == 7 + chunks
    assert signals.prompt_tokens_per_request == 7


async def test_all_replicas_failing_returns_last_error(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([s.url for s in stubs], health={"eject_after_failures": 100})
    for s in stubs:
        s.fail_status = 503
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + "/v1/chat/completions", json={"model": "stub-model", "messages": MSG}
        ) as resp,
    ):
        assert resp.status == 503
        assert_openai_error(await resp.json(), 1)  # the replica's own error body
    assert len(stubs[0].received) + len(stubs[1].received) == 2  # one try each, no more


async def test_broken_stream_ends_with_error_event_and_done(
    stubs: list[StubBackend], make_gateway: GatewayFactory, front: Front
) -> None:
    # Without failover (or with an engine that cannot continue) the client is told.
    gw = await make_gateway([stubs[0].url], failover={"enabled": False})
    stubs[0].break_after_chunks = 2
    body = {"model": "stub-model", "messages": MSG, "stream": True}
    async with (
        front.session(gw) as session,
        session.post(gw.url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200
        text = (await resp.read()).decode()
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))
    assert error["error"]["code"] == 502
    assert "w0" in events[0] and "w1" in events[1]


async def test_client_disconnect_closes_upstream(
    stubs: list[StubBackend], make_gateway: GatewayFactory, front: Front
) -> None:
    gw = await make_gateway([stubs[0].url])
    for stream in (False, True):
        stub = stubs[0]
        stub.hold = asyncio.Event()
        stub.disconnected = asyncio.Event()
        body = {"model": "stub-model", "messages": MSG, "stream": stream}

        async def call(body: dict = body) -> None:
            async with (
                front.session(gw) as session,
                session.post(gw.url + "/v1/chat/completions", json=body) as resp,
            ):
                await resp.read()

        task = asyncio.create_task(call())
        await wait_until(lambda: gw.signals().in_flight_total == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(stub.disconnected.wait(), 20)
        await wait_until(lambda: gw.signals().in_flight_total == 0)
        stub.hold.set()


async def test_metrics_exposition(stubs: list[StubBackend], make_gateway: GatewayFactory) -> None:
    gw = await make_gateway([stubs[0].url])
    async with aiohttp.ClientSession() as session:
        body = {"model": "stub-model", "messages": MSG, "stream": True}
        async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
            await resp.read()
        async with session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
        async with session.get(gw.url + "/health") as resp:
            health = await resp.json()
    assert health["status"] == "ok" and health["replicas_ready"] == 1
    for name in (
        'gpufleet_gateway_time_to_first_token_seconds_count{model="stub-model",tenant="default"} 1.0',
        'gpufleet_gateway_time_per_output_token_seconds_count{model="stub-model",tenant="default"} 1.0',
        'gpufleet_gateway_inter_token_latency_seconds_count{model="stub-model",tenant="default"}',
        'gpufleet_gateway_e2e_request_latency_seconds_count{model="stub-model",tenant="default"} 1.0',
        'gpufleet_gateway_requests_total{code="200",model="stub-model",tenant="default"} 1.0',
        "gpufleet_gateway_replica_requests_total",
        "gpufleet_gateway_replica_errors_total",
        "gpufleet_gateway_replica_ejections_total",
        "gpufleet_gateway_replica_in_flight",
        "gpufleet_gateway_queue_depth 0.0",
    ):
        assert name in text, name


async def test_one_connection_mixes_completions_and_other_requests(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    """One connection serves completions and other endpoints in any order."""
    gw = await make_gateway([stubs[0].url])
    body = {"model": "stub-model", "messages": MSG}
    connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection for everything
    async with aiohttp.ClientSession(connector=connector) as s:
        for _ in range(2):
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                assert (await resp.json())["served_by"] == "s0"
            async with s.get(gw.url + "/v1/models") as resp:
                assert [m["id"] for m in (await resp.json())["data"]] == ["stub-model"]
            async with s.post(gw.url + "/v1/chat/completions", json={**body, "stream": True}) as r:
                assert (await r.text()).endswith("data: [DONE]\n\n")
    assert len(stubs[0].received) == 4


async def _raw_exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 20)  # until the gateway closes
    writer.close()
    return data


async def test_raw_http_pipelining_expect_and_garbage(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([stubs[0].url])
    assert gw.port is not None
    body = json.dumps({"model": "stub-model", "prompt": "hi"}).encode()
    one = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
    # Two pipelined requests answer in order; the last asks to close.
    data = await _raw_exchange(
        gw.port, one + b"\r\n" + body + one + b"Connection: close\r\n\r\n" + body
    )
    assert data.count(b"HTTP/1.1 200 OK") == 2
    assert data.count(b'"served_by": "s0"') == 2
    # Expect: 100-continue gets its interim answer before the real one.
    data = await _raw_exchange(
        gw.port, one + b"Expect: 100-continue\r\nConnection: close\r\n\r\n" + body
    )
    assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    # Garbage is a 400 in OpenAI format, then the connection closes.
    data = await _raw_exchange(gw.port, b"NOT HTTP AT ALL\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400")
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 400


async def test_slow_body_gets_408(stubs: list[StubBackend], make_gateway: GatewayFactory) -> None:
    gw = await make_gateway([stubs[0].url], limits={"client_body_timeout_s": 0.2})
    assert gw.port is not None
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"
    data = await _raw_exchange(gw.port, head)  # the rest of the body never comes
    assert data.startswith(b"HTTP/1.1 408")
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 408


async def test_http10_stream_is_delimited_by_close(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([stubs[0].url])
    assert gw.port is not None
    body = json.dumps({"model": "stub-model", "messages": MSG, "stream": True}).encode()
    head = b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(body)
    data = await _raw_exchange(gw.port, head + body)
    head_part, _, payload = data.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 200")
    assert b"chunked" not in head_part.lower()
    assert payload.startswith(b"data: {") and payload.endswith(b"data: [DONE]\n\n")


async def test_each_chunk_leaves_as_it_arrives(
    stubs: list[StubBackend], make_gateway: GatewayFactory, front: Front
) -> None:
    """The first chunk reaches the client while the replica holds the rest back, on a
    fresh upstream connection and then on a reused one."""
    gw = await make_gateway([stubs[0].url])
    body = {"model": "stub-model", "messages": MSG, "stream": True}
    async with front.session(gw) as s:
        for _ in range(2):  # the second request reuses the kept-alive upstream connection
            stubs[0].gate = asyncio.Event()
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 20)
                assert b'"w0"' in first or b" w0" in first
                stubs[0].gate.set()  # only now does the replica send the rest
                rest = await resp.read()
            assert rest.endswith(b"data: [DONE]\n\n") and b" w4" in rest
    assert len(stubs[0].peer_ports) == 2
    assert stubs[0].peer_ports[0] == stubs[0].peer_ports[1]  # one upstream connection, reused


async def test_silent_replica_gets_504_without_retry(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway([s.url for s in stubs], limits={"read_timeout_s": 0.3})
    for s in stubs:
        s.hold = asyncio.Event()  # accept the request, never answer
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + "/v1/chat/completions", json={"model": "stub-model", "messages": MSG}
        ) as resp,
    ):
        assert resp.status == 504
        assert_openai_error(await resp.json(), 504)
    # Not retried: the request may still be running on the silent replica.
    assert len(stubs[0].received) + len(stubs[1].received) == 1
    for s in stubs:
        s.hold.set()
