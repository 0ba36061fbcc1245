"""The one HTTP front: every endpoint, every error in OpenAI JSON, whatever came before on
the connection (issue 13's defects 1, 2, 3, 5, 6, the Bearer scheme and half-closed sockets;
each test here failed before its fix)."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

from .conftest import ADMIN_KEY, GatewayFactory
from .stub_backend import StubBackend

pytestmark = pytest.mark.process  # every test here starts servers

MSG = [{"role": "user", "content": "hi"}]


def _deep(levels: int) -> bytes:
    return b'{"model": "stub-model", "messages": ' + b"[" * levels + b"]" * levels + b"}"


async def _exchange(port: int, *requests: bytes, half_close: bool = False) -> bytes:
    """Send raw requests on one connection and read until the gateway closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for r in requests:
        writer.write(r)
    await writer.drain()
    if half_close:
        writer.write_eof()
    data = await asyncio.wait_for(reader.read(), 20)
    writer.close()
    return data


def _post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s") % (path, len(body), extra, body)  # fmt: skip


GET_MODELS = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
CLOSE = b"Connection: close\r\n"


def _responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split a byte stream of Content-Length-framed responses (no 1xx, no chunking)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        n = int(headers["content-length"])
        out.append((status, headers, rest[:n]))
        data = rest[n:]
    return out


async def test_deep_nesting_is_a_json_400_on_any_connection(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    """Defects 1 and 6: 10,000 levels of nesting got a 500 and a RecursionError (and a
    plain-text 500 once the connection had served /v1/models)."""
    gw = await make_gateway([stubs[0].url])
    assert gw.port is not None
    deep = _post(b"/v1/chat/completions", _deep(10_000))
    for prefix in ((), (GET_MODELS,)):
        data = await _exchange(gw.port, *prefix, deep, _post(b"/v1/completions", b"{}", CLOSE))
        answers = _responses(data)
        assert [s for s, _, _ in answers] == [200] * len(prefix) + [400, 400]
        for _, headers, body in answers[len(prefix) :]:
            assert headers["content-type"] == "application/json"
            assert json.loads(body)["error"]["code"] == 400
    assert stubs[0].received == []


@pytest.mark.parametrize("policy", ["prefix_aware", "round_robin"])
async def test_lone_surrogates_are_forwarded_by_every_policy(
    stubs: list[StubBackend], make_gateway: GatewayFactory, policy: str
) -> None:
    """Defect 2: with prefix_aware a lone surrogate got a 500 (UnicodeEncodeError)."""
    gw = await make_gateway([stubs[0].url], policy=policy)
    escaped = (
        b'{"model": "stub-model", "messages": [{"role": "user", "content": "a\\ud800b'
        + (b"x" * 600)
        + b'"}]}'
    )
    raw = escaped.replace(b"\\ud800", b"\xed\xa0\x80")  # the same, as bytes UTF-8 forbids
    async with aiohttp.ClientSession() as s:
        for body in (escaped, raw):
            async with s.post(gw.url + "/v1/chat/completions", data=body) as resp:
                assert resp.status == 200, await resp.text()
    assert stubs[0].received == [escaped, raw]


async def test_an_internal_error_says_connection_close(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    """Defect 3: after a 500 the gateway closed the connection without saying so."""
    gw = await make_gateway([stubs[0].url])
    assert gw.port is not None and gw._front is not None

    async def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    gw._front.handler = broken
    body = json.dumps({"model": "stub-model", "messages": MSG}).encode()
    data = await _exchange(gw.port, _post(b"/v1/chat/completions", body))
    ((status, headers, payload),) = _responses(data)
    assert status == 500
    assert headers["connection"] == "close"
    assert json.loads(payload)["error"]["code"] == 500


async def test_models_needs_a_tenant_key_and_bearer_is_case_insensitive(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    """Defect 5: /v1/models answered without a key while completions answered 401; and
    the `Bearer` scheme name is case-insensitive (RFC 7235)."""
    gw = await make_gateway([stubs[0].url], tenants=[{"name": "t", "api_keys": ["sk-t"]}])
    async with aiohttp.ClientSession() as s:
        for auth in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-t"}):
            async with s.get(gw.url + "/v1/models", headers=auth) as resp:
                assert resp.status == 401
                assert (await resp.json())["error"]["code"] == 401
        for scheme in ("Bearer", "bearer", "BEARER"):
            auth = {"Authorization": f"{scheme} sk-t"}
            async with s.get(gw.url + "/v1/models", headers=auth) as resp:
                assert resp.status == 200
                assert [m["id"] for m in (await resp.json())["data"]] == ["stub-model"]
            body = {"model": "stub-model", "messages": MSG}
            async with s.post(gw.url + "/v1/chat/completions", json=body, headers=auth) as resp:
                assert resp.status == 200
            admin = {"Authorization": f"{scheme} {ADMIN_KEY}"}
            async with s.get(gw.url + "/admin/replicas", headers=admin) as resp:
                assert resp.status == 200
        async with s.get(gw.url + "/health") as resp:  # health and metrics stay open
            assert resp.status == 200


async def test_oversized_headers_after_another_request_get_a_json_431(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    """Defect 6: once a connection had served /v1/models, a header over 32 KB got a
    plain-text `HTTP/1.0 400` from the second front."""
    gw = await make_gateway([stubs[0].url])
    assert gw.port is not None
    body = json.dumps({"model": "stub-model", "messages": MSG}).encode()
    big = b"X-Big: " + b"a" * 40_000 + b"\r\n"
    for prefix in ((), (GET_MODELS,)):
        data = await _exchange(gw.port, *prefix, _post(b"/v1/chat/completions", body, big))
        answers = _responses(data)
        status, headers, payload = answers[-1]
        assert data.startswith(b"HTTP/1.1 ")
        assert status == 431 and headers["content-type"] == "application/json"
        assert json.loads(payload)["error"]["code"] == 431
    # Every endpoint's errors are the same JSON: unknown route, wrong method, admin.
    data = await _exchange(
        gw.port,
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n",
        b"DELETE /admin/replicas/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert [(s, json.loads(b)["error"]["code"]) for s, _, b in _responses(data)] == [
        (404, 404), (405, 405), (401, 401)]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
async def test_half_closed_client_still_gets_its_answer(
    stubs: list[StubBackend], make_gateway: GatewayFactory, stream: bool
) -> None:
    """A client that shuts down its sending side after the request still gets the answer
    (an interim 100 Continue may come first: HTTP/1.1 clients skip it)."""
    gw = await make_gateway([stubs[0].url])
    assert gw.port is not None
    stubs[0].chunk_delay_s = 0.05  # the answer comes well after the client's EOF
    body = json.dumps({"model": "stub-model", "messages": MSG, "stream": stream}).encode()
    data = await _exchange(gw.port, _post(b"/v1/chat/completions", body), half_close=True)
    data = data.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200 OK")
    if stream:
        assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    else:
        assert json.loads(data.partition(b"\r\n\r\n")[2])["choices"][0]["message"]["content"]


async def test_a_client_that_closes_still_cancels_its_request(
    stubs: list[StubBackend], make_gateway: GatewayFactory
) -> None:
    """The flip side of half-close support: a client that really closed (not just its
    sending side) is noticed before the answer is ready, and the upstream is closed."""
    gw = await make_gateway([stubs[0].url])
    assert gw.port is not None
    stubs[0].hold = asyncio.Event()
    body = json.dumps({"model": "stub-model", "messages": MSG}).encode()
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.sendall(_post(b"/v1/chat/completions", body))
    while gw.signals().in_flight_total == 0:
        await asyncio.sleep(0.01)
    sock.close()
    await asyncio.wait_for(stubs[0].disconnected.wait(), 20)
    stubs[0].hold.set()
