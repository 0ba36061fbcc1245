"""Incremental parser for server-sent events as OpenAI-compatible servers stream them.

Feed it the bytes as they arrive; it returns the `data` payload of every complete event.
Comment lines (`: ping`) and other fields are skipped; CRLF line ends are accepted.
"""

from __future__ import annotations


class SSEParser:
    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data payloads of the events completed by `chunk` (possibly none)."""
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf + chunk if self._buf else chunk
        if b"\n\n" not in buf:
            self._buf = buf
            return []
        *events, self._buf = buf.split(b"\n\n")
        out: list[bytes] = []
        for event in events:
            data = _event_data(event)
            if data is not None:
                out.append(data)
        return out

    def flush(self) -> list[bytes]:
        """The last event if the stream ended without its blank line."""
        buf, self._buf = self._buf, b""
        data = _event_data(buf)
        return [] if data is None else [data]


def _event_data(event: bytes) -> bytes | None:
    if event.startswith(b"data:") and b"\n" not in event:  # the common one-line event
        return event[6:] if event[5:6] == b" " else event[5:]
    lines = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            lines.append(line[6:] if line[5:6] == b" " else line[5:])
    return b"\n".join(lines) if lines else None
