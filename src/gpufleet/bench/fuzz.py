"""A deterministic corpus of bad and edge-case HTTP requests, and a runner that checks how
an OpenAI-compatible server answers them.

`corpus(model)` builds the same few thousand cases every time (no randomness beyond a
seeded generator), in classes: deep_nesting, lone_surrogates, invalid_utf8, huge_numbers,
nan_inf, wrong_types, edge_values, oversized_headers, oversized_bodies, http_garbage,
pipelining, half_closed, slowloris, endpoints. Each case is the raw bytes a client writes
on one connection (and how: all at once, trickled, or followed by a half-close).

`run_corpus(host, port, cases)` plays them on real sockets and flags, per case:
- 5xx: any answer with a status of 500 or more;
- non_json_4xx: a 4xx whose body is not an OpenAI error (`{"error": {"message", "type",
  "param", "code"}}`) in JSON;
- dropped: the connection closed or was reset before the case got all its answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field

import httptools

PROBLEMS = ("5xx", "non_json_4xx", "dropped")
_ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass(frozen=True, slots=True)
class FuzzCase:
    klass: str
    name: str
    chunks: tuple[bytes, ...]  # written in order on one connection
    answers: int = 1  # final responses the server owes (requests it can tell apart)
    gap_s: float = 0.0  # pause between chunks (slowloris)
    half_close: bool = False  # shut down the sending side after the last chunk


@dataclass
class FuzzResult:
    case: FuzzCase
    statuses: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    detail: str = ""


# -- the corpus ------------------------------------------------------------------------------
def _post(path: bytes, body: bytes, headers: bytes = b"", close: bool = True) -> bytes:
    conn = b"Connection: close\r\n" if close else b""
    return (b"POST %s HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s%s\r\n%s") % (path, len(body), headers, conn, body)  # fmt: skip


def _get(path: bytes, headers: bytes = b"", close: bool = True) -> bytes:
    conn = b"Connection: close\r\n" if close else b""
    return b"GET %s HTTP/1.1\r\nHost: fuzz\r\n%s%s\r\n" % (path, headers, conn)


CHAT, COMPLETIONS = b"/v1/chat/completions", b"/v1/completions"


def _bodies(model: str) -> dict[bytes, dict[str, object]]:
    """A valid small request per endpoint (max_tokens 2: forwarded cases stay cheap)."""
    return {
        CHAT: {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        COMPLETIONS: {"model": model, "prompt": "hi", "max_tokens": 2},
    }


def _with(base: dict[str, object], key: str, raw: bytes) -> bytes:
    """`base` as JSON with `key` set to the raw JSON text `raw` (which may be invalid)."""
    rest = {k: v for k, v in base.items() if k != key}
    head = json.dumps(rest)[:-1].encode()
    return head + (b", " if rest else b"") + json.dumps(key).encode() + b": " + raw + b"}"


def _nested(depth: int, inner: bytes = b"1", kind: str = "list") -> bytes:
    if kind == "list":
        return b"[" * depth + inner + b"]" * depth
    return b'{"a": ' * depth + inner + b"}" * depth


# Raw JSON values, by class: each goes into every field below (the heavy ones, marked
# big, only into the prompt and one unknown field).
# fmt: off
_VALUES: dict[str, list[bytes]] = {
    "deep_nesting": [_nested(d, kind=k) for d in (64, 1000, 10_000) for k in ("list", "dict")],
    "lone_surrogates": [b'"a\\ud800b"', b'"\\udfff"', b'"\\ud800\\ud800"', b'"x\\udbff"',
                        b'["\\ud834"]', b'{"\\ud800": 1}', b'"\\udc00\\ud800"'],
    "invalid_utf8": [b'"\xc0\x80"', b'"\xff\xfe"', b'"\xed\xa0\x80"', b'"\xe2\x82"',
                     b'"\xf4\x90\x80\x80"', b'"\x80abc"', b'"ok\xc3"'],
    "huge_numbers": [b"1" + b"0" * 5000, b"-" + b"9" * 400, b"1e999999", b"-1e400",
                     b"18446744073709551617", b"4.9e-325", b"1" * 20, b"-0", b"1E+308"],
    "nan_inf": [b"NaN", b"Infinity", b"-Infinity", b"[NaN]", b'{"x": Infinity}', b"-NaN"],
    "wrong_types": [b"null", b"true", b"false", b"0", b"-1", b"1.5", b'""', b'"x"', b"[]",
                    b"{}", b"[1, 2]", b'["a", 2]', b'[{"role": 1}]', b'{"role": "user"}',
                    b"[null]", b"[[]]", b'{"type": "text"}', b'[{"type": "image_url"}]'],
    "edge_values": [b'"\\u0000"', b'"\\n\\r\\t"', b'"<|eos|> <|end|>"',
                    b'"' + "é☕😀".encode() * 50 + b'"', b'"\\\\"', b'" "', b'"\\"'],
}
_BIG: dict[str, list[bytes]] = {
    "deep_nesting": [_nested(100_000), _nested(100_000, kind="dict")],
    "edge_values": [b'"' + b"w " * 20_000 + b'"',
                    b"[" + b",".join([b'{"role": "user", "content": "x"}'] * 500) + b"]"],
}
# fmt: on
_FIELDS: dict[bytes, tuple[str, ...]] = {
    CHAT: (
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "stream",
        "stream_options",
        "user",
        "n",
        "seed",
        "stop",
        "top_p",
        "logprobs",
        "tools",
        "response_format",
        "vendor_extra",
    ),
    COMPLETIONS: (
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "stream",
        "echo",
        "user",
        "n",
        "seed",
        "stop",
        "logprobs",
        "suffix",
        "vendor_extra",
    ),
}  # fmt: skip


def _field_cases(model: str) -> list[FuzzCase]:
    out = []
    bodies = _bodies(model)
    for path, fields in _FIELDS.items():
        base = bodies[path]
        for klass, values in _VALUES.items():
            for name in fields:
                for i, raw in enumerate(values):
                    body = _with(base, name, raw)
                    label = f"{path.decode()} {name}={klass}[{i}]"
                    out.append(FuzzCase(klass, label, (_post(path, body),)))
        for klass, values in _BIG.items():
            for name in (fields[1], "vendor_extra"):  # the prompt, and an unknown field
                for i, raw in enumerate(values):
                    out.append(FuzzCase(klass, f"{path.decode()} {name}=big {klass}[{i}]",
                                        (_post(path, _with(base, name, raw)),)))  # fmt: skip
        # Inside a message, where the prompt is read.
        if path == CHAT:
            for klass, values in _VALUES.items():
                for i, raw in enumerate(values):
                    for key in ("content", "role", "name"):
                        msg = b'[{"role": "user", "content": "hi", "' + key.encode() + b'": '
                        body = _with(base, "messages", msg + raw + b"}]")
                        out.append(FuzzCase(klass, f"message {key}={klass}[{i}]",
                                            (_post(path, body),)))  # fmt: skip
    return out


def _body_cases(model: str) -> list[FuzzCase]:
    """Whole bodies that are not a request object at all."""
    raws = [b"", b"null", b"[]", b'"x"', b"1", b"{", b"}", b"{}", b"{,}", b'{"a":1}x',
            b"\xef\xbb\xbf{}", b'{"model": "m", "model": 1}', b"/* c */ {}", b"{'a': 1}",
            b"\x00" * 16, b"\xff" * 16, b"[" * 200_000, _nested(50_000, kind="dict")]  # fmt: skip
    out = []
    for path in (CHAT, COMPLETIONS):
        for i, raw in enumerate(raws):
            klass = "deep_nesting" if len(raw) > 100_000 else "wrong_types"
            out.append(FuzzCase(klass, f"{path.decode()} body[{i}]", (_post(path, raw),)))
    return out


def _http_cases(model: str) -> list[FuzzCase]:
    ok = json.dumps(_bodies(model)[CHAT]).encode()
    big = b"a" * 40_000
    cases = [
        ("oversized_headers", "one 40 KB header", _post(CHAT, ok, b"X-Big: " + big + b"\r\n")),
        ("oversized_headers", "2000 headers", _post(CHAT, ok, b"".join(
            b"X-H%d: v\r\n" % i for i in range(2000)))),
        ("oversized_headers", "64 KB URL", _post(b"/v1/chat/completions?" + big + big, ok)),
        ("oversized_headers", "huge header name", _post(CHAT, ok, big + b": v\r\n")),
        ("oversized_bodies", "Content-Length 10 GB", b"POST /v1/chat/completions HTTP/1.1\r\n"
         b"Host: f\r\nContent-Length: 10000000000\r\n\r\n{"),
        ("oversized_bodies", "chunked 8 MB", b"POST /v1/completions HTTP/1.1\r\nHost: f\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n" + b"100000\r\n" + b"a" * 0x100000 + b"\r\n" * 1
         + b"".join(b"100000\r\n" + b"a" * 0x100000 + b"\r\n" for _ in range(7)) + b"0\r\n\r\n"),
        ("oversized_bodies", "5 MB JSON", _post(COMPLETIONS, _with(_bodies(model)[COMPLETIONS],
                                                                   "prompt", b'"' + b"w " * 2_500_000 + b'"'))),
        ("http_garbage", "not HTTP", b"NOT HTTP AT ALL\r\n\r\n"),
        ("http_garbage", "HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("http_garbage", "bad method", b"BREW /v1/models HTTP/1.1\r\nHost: f\r\n\r\n"),
        ("http_garbage", "negative length", b"POST /v1/completions HTTP/1.1\r\nHost: f\r\n"
         b"Content-Length: -5\r\n\r\n"),
        ("http_garbage", "two lengths", b"POST /v1/completions HTTP/1.1\r\nHost: f\r\n"
         b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
        ("http_garbage", "length and chunked", b"POST /v1/completions HTTP/1.1\r\nHost: f\r\n"
         b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
        ("http_garbage", "bad chunk size", b"POST /v1/completions HTTP/1.1\r\nHost: f\r\n"
         b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
        ("http_garbage", "NUL in header", b"GET /health HTTP/1.1\r\nHost: f\x00x\r\n\r\n"),
        ("http_garbage", "bare LF", b"GET /health HTTP/1.1\nHost: f\n\n"),
        ("http_garbage", "HTTP/0.9", b"GET /health\r\n\r\n"),
        ("http_garbage", "HTTP/9.9", b"GET /health HTTP/9.9\r\nHost: f\r\n\r\n"),
        ("invalid_utf8", "bytes in path", b"GET /v1/\xff\xfe HTTP/1.1\r\nHost: f\r\n\r\n"),
        ("invalid_utf8", "bytes in header", _post(CHAT, ok, b"X-Session-Id: \xc0\x80\xff\r\n")),
        ("invalid_utf8", "bytes in auth", _post(CHAT, ok, b"Authorization: Bearer \xff\xfe\r\n")),
        ("lone_surrogates", "surrogate in session", _post(CHAT, ok, b"X-Session-Id: \xed\xa0\x80\r\n")),
    ]  # fmt: skip
    out = [FuzzCase(k, n, (raw,)) for k, n, raw in cases]
    for scheme in (b"Bearer", b"bearer", b"BEARER", b"Basic", b"Bearer  ", b""):
        out.append(FuzzCase("wrong_types", f"authorization {scheme!r}",
                            (_post(CHAT, ok, b"Authorization: " + scheme + b" k\r\n"),)))  # fmt: skip
    return out


def _connection_cases(model: str, rng: random.Random) -> list[FuzzCase]:
    ok_chat = json.dumps(_bodies(model)[CHAT]).encode()
    ok_comp = json.dumps({**_bodies(model)[COMPLETIONS], "stream": True}).encode()
    deep = _with(_bodies(model)[CHAT], "messages", _nested(10_000))
    pieces = [
        _post(CHAT, ok_chat, close=False), _post(COMPLETIONS, ok_comp, close=False),
        _post(CHAT, deep, close=False), _get(b"/v1/models", close=False),
        _get(b"/health", close=False), _get(b"/metrics", close=False),
        _get(b"/nope", close=False), _post(CHAT, b"{", close=False),
        _get(b"/admin/replicas", close=False),
    ]  # fmt: skip
    out = []
    for i in range(60):  # pipelines of 2-6 requests of mixed kinds, the last one closing
        n = 2 + i % 5
        chosen = [rng.choice(pieces) for _ in range(n - 1)]
        last = _get(b"/health") if i % 2 else _post(CHAT, ok_chat)
        out.append(FuzzCase("pipelining", f"pipeline {i}", (b"".join([*chosen, last]),), n))
    for i, piece in enumerate(pieces):  # half-closed after a whole request
        out.append(FuzzCase("half_closed", f"half-closed {i}", (piece,), half_close=True))
    out.append(FuzzCase("half_closed", "half-closed mid-request",
                        (_post(CHAT, ok_chat)[:-10],), half_close=True))  # fmt: skip
    for i, piece in enumerate(
        (_post(CHAT, ok_chat), _get(b"/health"), _post(COMPLETIONS, ok_comp))
    ):
        step = max(1, len(piece) // 12)  # a whole request, trickled in 12 parts
        out.append(FuzzCase("slowloris", f"trickled {i}", tuple(
            piece[j : j + step] for j in range(0, len(piece), step)), gap_s=0.01))  # fmt: skip
    for i in range(6):  # never finished: headers (or body) trickle in, then stop
        head = _post(CHAT, ok_chat)[: 20 + 17 * i]
        out.append(FuzzCase("slowloris", f"unfinished {i}",
                            tuple(head[j : j + 3] for j in range(0, len(head), 3)), gap_s=0.002))  # fmt: skip
    return out


def _endpoint_cases(model: str) -> list[FuzzCase]:
    out = []
    for path in (b"/v1/models", b"/health", b"/metrics", b"/admin/replicas", b"/admin/signals",
                 b"/admin/replicas/x/drain", b"/admin/reload", b"/v1/chat/completions",
                 b"/v1/completions", b"/", b"/v1", b"/v1/models/x", b"//v1/models",
                 b"/v1/models?x=\xff", b"/%00", b"/../etc/passwd"):  # fmt: skip
        for method in (b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH"):
            for auth, body in ((b"Authorization: Bearer wrong\r\n", b'{"url": 1}'),
                               (b"", b"\xff[")):  # fmt: skip
                raw = (b"%s %s HTTP/1.1\r\nHost: f\r\n%sContent-Length: %d\r\n"
                       b"Connection: close\r\n\r\n%s") % (method, path, auth, len(body), body)  # fmt: skip
                label = f"{method.decode()} {path!r} {'key' if auth else 'no key'}"
                out.append(FuzzCase("endpoints", label, (raw,)))
    return out


def corpus(model: str, seed: int = 13) -> list[FuzzCase]:
    """The whole corpus for servers that serve `model` (the same list on every call)."""
    rng = random.Random(seed)
    return [*_field_cases(model), *_body_cases(model), *_http_cases(model),
            *_connection_cases(model, rng), *_endpoint_cases(model)]  # fmt: skip


# -- the runner ------------------------------------------------------------------------------
class _Responses:
    """Collects the responses on one connection (httptools callbacks). A response to HEAD
    has no body whatever its headers say, so one is complete with its headers."""

    def __init__(self, heads: int) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[tuple[int, bytes, bytes]] = []  # status, content type, body
        self.heads = heads  # leading HEAD requests still to answer
        self._ctype = b""
        self._body: list[bytes] = []

    def on_message_begin(self) -> None:
        self._ctype = b""
        self._body = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self._ctype = value

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if self.heads and status >= 200:
            self.heads -= 1
            self.done.append((status, self._ctype, b""))
            raise _HeadDone  # the parser cannot be told; stop here

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if status >= 200:  # 1xx are interim
            self.done.append((status, self._ctype, b"".join(self._body)))


class _HeadDone(Exception):
    pass


def _is_openai_error(ctype: bytes, body: bytes) -> bool:
    if not ctype.startswith(b"application/json"):
        return False
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(err, dict) and set(err) >= _ERROR_KEYS


async def run_case(host: str, port: int, case: FuzzCase, timeout_s: float = 30.0) -> FuzzResult:
    """Write the case's chunks while reading the answers (a server may answer, and close,
    before a slow or oversized request is all written)."""
    result = FuzzResult(case)
    heads = 1 if case.chunks and case.chunks[0].startswith(b"HEAD ") else 0
    got = _Responses(heads)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        result.problems.append("dropped")
        result.detail = f"connect: {exc!r}"
        return result

    async def write() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            for chunk in case.chunks:
                writer.write(chunk)
                await writer.drain()
                if case.gap_s:
                    await asyncio.sleep(case.gap_s)
            if case.half_close and writer.can_write_eof():
                writer.write_eof()

    closed_early = ""
    sending = asyncio.create_task(write())
    try:
        async with asyncio.timeout(timeout_s):
            while len(got.done) < case.answers:
                data = await reader.read(1 << 16)
                if not data:
                    break
                try:
                    got.parser.feed_data(data)
                except httptools.HttpParserCallbackError:
                    break  # the answer to HEAD
                except httptools.HttpParserError as exc:
                    closed_early = f"unparsable answer: {exc}"
                    break
    except (ConnectionError, OSError) as exc:
        closed_early = f"{exc!r}"
    except TimeoutError:
        closed_early = "no answer in time"
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    result.statuses = [s for s, _, _ in got.done]
    for status, ctype, body in got.done:
        if status >= 500 and "5xx" not in result.problems:
            result.problems.append("5xx")
            result.detail = body[:200].decode("utf-8", "replace")
        elif (
            400 <= status < 500
            and "non_json_4xx" not in result.problems
            and not _is_openai_error(ctype, body)
            and not (heads and not body)
        ):
            result.problems.append("non_json_4xx")
            result.detail = f"{status} {ctype!r} {body[:120]!r}"
    if not got.done or (len(got.done) < case.answers and not _refused(got.done)):
        result.problems.append("dropped")
        result.detail = result.detail or closed_early or "closed without an answer"
    return result


def _refused(done: list[tuple[int, bytes, bytes]]) -> bool:
    """A connection may close after an answer that refused it (a 4xx the server cannot
    read past, like a body too large or malformed HTTP): that is not a drop."""
    return bool(done) and done[-1][0] in (400, 408, 413, 414, 431)


async def run_corpus(
    host: str, port: int, cases: list[FuzzCase], concurrency: int = 32
) -> list[FuzzResult]:
    """Play every case (`concurrency` connections at a time); results in case order."""
    sem = asyncio.Semaphore(concurrency)

    async def one(case: FuzzCase) -> FuzzResult:
        async with sem:
            return await run_case(host, port, case)

    return list(await asyncio.gather(*(one(c) for c in cases)))


def summarize(results: list[FuzzResult]) -> dict[str, dict[str, int]]:
    """Per class: cases, and how many had each problem."""
    table: dict[str, Counter[str]] = {}
    for r in results:
        row = table.setdefault(r.case.klass, Counter())
        row["cases"] += 1
        for p in r.problems:
            row[p] += 1
    return {k: {"cases": v["cases"], **{p: v.get(p, 0) for p in PROBLEMS}}
            for k, v in sorted(table.items())}  # fmt: skip
