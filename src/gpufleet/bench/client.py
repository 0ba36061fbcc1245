"""Send one streaming request and record what arrives, as vLLM's benchmark client does.

Every failure becomes an error on that request's record (classified by HTTP status and
error type); nothing here raises, so one bad response never stops a run.
"""

from __future__ import annotations

import asyncio
import json
from time import perf_counter
from typing import Any

import aiohttp

from gpufleet.bench.records import RequestRecord
from gpufleet.bench.sse import SSEParser

_DONE = b"[DONE]"


class _StreamError(Exception):
    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type


def _http_error(status: int, raw: bytes, reason: str | None) -> tuple[str, str]:
    """(error type, message) of a non-200 answer, from its OpenAI-format body when it has one."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        err = None
    if isinstance(err, dict):
        etype = err.get("type") or f"http_{status}"
        return str(etype), str(err.get("message", ""))[:500]
    text = raw[:300].decode("utf-8", "replace")
    return f"http_{status}", (text or reason or "").strip()


def _apply_event(rec: RequestRecord, data: bytes, now: float, pieces: list[str]) -> bool:
    """Fold one SSE data payload into `rec`; False once the stream says it is done."""
    if data == _DONE:
        return False
    try:
        obj: Any = json.loads(data)
    except ValueError:
        raise _StreamError("malformed_chunk", f"not JSON: {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise _StreamError("malformed_chunk", f"not a JSON object: {data[:200]!r}")
    err = obj.get("error")
    if err:
        etype = err.get("type", "stream_error") if isinstance(err, dict) else "stream_error"
        msg = err.get("message", "") if isinstance(err, dict) else str(err)
        raise _StreamError(str(etype), f"error event in stream: {msg}"[:500])
    choices = obj.get("choices")
    if choices:
        choice = choices[0] if isinstance(choices, list) else None
        if not isinstance(choice, dict):
            raise _StreamError("malformed_chunk", f"bad choices: {data[:200]!r}")
        rec.token_times_s.append(now)
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(piece, str) and piece:
            pieces.append(piece)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        completion = usage.get("completion_tokens")
        if isinstance(completion, int):
            rec.usage_completion_tokens = completion
        prompt = usage.get("prompt_tokens")
        if isinstance(prompt, int):
            rec.prompt_tokens = prompt
    return True


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    rec: RequestRecord,
) -> RequestRecord:
    """POST `body` to `url` with streaming and fill `rec` with the timeline."""
    pieces: list[str] = []
    rec.start_s = perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            rec.status = resp.status
            if resp.status != 200:
                raw = await resp.read()
                rec.error_type, rec.error = _http_error(resp.status, raw, resp.reason)
                return rec
            parser = SSEParser()
            going = True
            async for chunk in resp.content.iter_any():
                now = perf_counter()  # one timestamp per network read, taken on arrival
                for data in parser.feed(chunk):
                    going = _apply_event(rec, data, now, pieces)
                    if not going:
                        break
                if not going:
                    break
            if going:
                now = perf_counter()
                for data in parser.flush():
                    _apply_event(rec, data, now, pieces)
    except _StreamError as e:
        rec.error_type, rec.error = e.error_type, str(e)
    except TimeoutError:
        rec.error_type, rec.error = "timeout", "request timed out"
    except aiohttp.ClientConnectorError as e:
        rec.error_type, rec.error = "connect_error", str(e)
    except aiohttp.ServerDisconnectedError as e:
        rec.error_type, rec.error = "server_disconnected", str(e) or "server disconnected"
    except aiohttp.ClientPayloadError as e:
        rec.error_type, rec.error = "truncated_stream", str(e)
    except aiohttp.ClientError as e:
        rec.error_type, rec.error = type(e).__name__, str(e)
    except asyncio.CancelledError:
        rec.error_type, rec.error = "cancelled", "the run stopped before this request finished"
        raise
    except Exception as e:  # a run must survive any one bad response
        rec.error_type, rec.error = type(e).__name__, repr(e)[:500]
    else:
        rec.text = "".join(pieces)
        if rec.token_times_s:
            rec.ok = True
        else:
            rec.error_type = "no_token_chunk"
            rec.error = "the stream ended without any event carrying choices"
    return rec
