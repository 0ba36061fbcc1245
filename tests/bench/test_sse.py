from gpufleet.bench.sse import SSEParser


def test_events_split_across_reads() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"a"') == []
    assert p.feed(b": 1}\n") == []
    assert p.feed(b'\ndata: {"b": 2}\n\ndata: [DO') == [b'{"a": 1}', b'{"b": 2}']
    assert p.feed(b"NE]\n\n") == [b"[DONE]"]
    assert p.flush() == []


def test_crlf_comments_multiline_and_other_fields() -> None:
    p = SSEParser()
    out = p.feed(
        b": ping\r\n\r\nevent: x\r\ndata: one\r\ndata: two\r\nid: 3\r\n\r\ndata:nospace\n\n"
    )
    assert out == [b"one\ntwo", b"nospace"]


def test_flush_returns_an_unterminated_last_event() -> None:
    p = SSEParser()
    assert p.feed(b"data: [DONE]") == []
    assert p.flush() == [b"[DONE]"]
