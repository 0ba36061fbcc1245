"""Metric arithmetic on recorded chunk timelines: no network, no clock."""

from __future__ import annotations

import pytest

from gpufleet.bench.client import _apply_event, _StreamError
from gpufleet.bench.metrics import parse_goodput, request_metrics, summarize
from gpufleet.bench.records import RequestRecord
from gpufleet.stats import mean, percentile, std


def rec(
    start: float, times: list[float], usage: int | None, text: str = "", prompt: int = 10
) -> RequestRecord:
    return RequestRecord(
        start_s=start,
        token_times_s=list(times),
        usage_completion_tokens=usage,
        text=text,
        prompt_tokens=prompt,
        ok=True,
        status=200,
    )


def test_ttft_itl_e2e_tpot_from_a_timeline() -> None:
    m = request_metrics(rec(10.0, [10.1, 10.15, 10.2, 10.25], usage=4))
    assert m is not None
    assert m.ttft_s == pytest.approx(0.1)
    assert m.itls_s == pytest.approx((0.05, 0.05, 0.05))
    assert m.e2e_s == pytest.approx(0.25)
    assert m.output_tokens == 4
    assert m.tpot_s == pytest.approx(0.15 / 3)


def test_tpot_uses_usage_tokens_not_chunk_count() -> None:
    # Two chunks carrying 5 tokens in all (a server that bundles tokens).
    m = request_metrics(rec(0.0, [0.2, 0.6], usage=5))
    assert m is not None
    assert m.tpot_s == pytest.approx(0.4 / 4)
    assert m.itls_s == pytest.approx((0.4,))


def test_one_output_token_has_no_tpot_and_counts_as_zero_for_goodput() -> None:
    one = rec(0.0, [0.3], usage=1)
    m = request_metrics(one)
    assert m is not None
    assert m.tpot_s is None and m.itls_s == () and m.e2e_s == pytest.approx(0.3)
    s = summarize([one], 1.0, goodput_slo_ms={"ttft": 500, "tpot": 1})
    assert s.tpot_ms["mean"] == 0.0  # no TPOT sample at all, as vLLM reports
    assert s.request_goodput == 1.0  # tpot treated as 0 for the SLO check


def test_usage_missing_falls_back_to_counting_the_text() -> None:
    m = request_metrics(rec(0.0, [0.1, 0.2, 0.3], usage=None, text=" ba be bi"))
    assert m is not None and m.output_tokens == 3
    assert m.tpot_s == pytest.approx(0.1)
    # usage 0 also falls back, as in vLLM (`if not output_len`)
    m0 = request_metrics(rec(0.0, [0.1, 0.2, 0.3], usage=0, text=" ba be"))
    assert m0 is not None and m0.output_tokens == 2


def test_empty_first_chunk_counts_for_ttft_like_vllm() -> None:
    r = RequestRecord(start_s=0.0)
    pieces: list[str] = []
    role = b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
    _apply_event(r, role, 0.05, pieces)
    for t, w in ((0.2, "ba"), (0.3, "be"), (0.4, "bi")):
        _apply_event(
            r, b'{"choices":[{"index":0,"delta":{"content":" %s"}}]}' % w.encode(), t, pieces
        )
    _apply_event(
        r, b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}', 0.5, pieces
    )
    assert not _apply_event(r, b"[DONE]", 0.5, pieces)
    r.ok, r.text = True, "".join(pieces)
    m = request_metrics(r)
    assert m is not None
    assert m.ttft_s == pytest.approx(0.05)  # the role-only event carries choices
    assert m.e2e_s == pytest.approx(0.4)  # the usage event is not a token
    assert m.output_tokens == 3 and m.prompt_tokens == 7
    assert m.tpot_s == pytest.approx((0.4 - 0.05) / 2)
    assert r.text == " ba be bi"


def test_completions_text_and_usage_parse() -> None:
    r = RequestRecord()
    pieces: list[str] = []
    _apply_event(r, b'{"choices":[{"index":0,"text":" hi","finish_reason":null}]}', 1.0, pieces)
    _apply_event(
        r, b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}', 1.1, pieces
    )
    assert r.token_times_s == [1.0]
    assert r.usage_completion_tokens == 1 and r.prompt_tokens == 3
    assert pieces == [" hi"]


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (b"{not json", "malformed_chunk"),
        (b"[1, 2]", "malformed_chunk"),
        (b'{"choices": ["x"]}', "malformed_chunk"),
        (b'{"error": {"type": "InternalServerError", "message": "boom"}}', "InternalServerError"),
    ],
)
def test_bad_events_raise_a_classified_stream_error(payload: bytes, kind: str) -> None:
    with pytest.raises(_StreamError) as e:
        _apply_event(RequestRecord(), payload, 0.0, [])
    assert e.value.error_type == kind


def test_summary_matches_vllm_definitions() -> None:
    ok1 = rec(0.0, [0.1, 0.2, 0.3], usage=3, prompt=100)
    ok2 = rec(1.0, [1.3, 1.5], usage=2, prompt=50)
    bad = RequestRecord(
        start_s=0.5, ok=False, status=429, error_type="RateLimitError", error="slow down"
    )
    s = summarize([ok1, ok2, bad], 2.0, goodput_slo_ms={"ttft": 200})
    assert s.completed == 2 and s.failed == 1
    assert s.total_input_tokens == 150 and s.total_output_tokens == 5
    assert s.request_throughput == pytest.approx(1.0)
    assert s.output_throughput == pytest.approx(2.5)
    assert s.total_token_throughput == pytest.approx(77.5)
    assert s.request_goodput == pytest.approx(0.5)  # only ok1 has TTFT <= 200 ms
    assert s.ttft_ms["mean"] == pytest.approx(200.0)
    assert s.ttft_ms["median"] == pytest.approx(200.0)
    assert s.ttft_ms["std"] == pytest.approx(100.0)
    # TPOT: ok1 (0.3-0.1)/2 = 0.1, ok2 (0.5-0.3)/1 = 0.2
    assert s.tpot_ms["mean"] == pytest.approx(150.0)
    assert s.itl_ms["mean"] == pytest.approx(1000 * (0.1 + 0.1 + 0.2) / 3)
    assert s.e2el_ms["p99"] == pytest.approx(300 + 0.99 * 200)
    assert s.max_concurrent_requests == 1
    assert [(f.status, f.error_type, f.count) for f in s.failures] == [(429, "RateLimitError", 1)]
    flat = s.flat()
    assert flat["mean_ttft_ms"] == pytest.approx(200.0) and flat["p99_tpot_ms"] > 0


def test_goodput_needs_every_slo() -> None:
    fast_ttft_slow_tpot = rec(0.0, [0.05, 0.5], usage=2)
    s = summarize([fast_ttft_slow_tpot], 1.0, goodput_slo_ms={"ttft": 100, "tpot": 100})
    assert s.request_goodput == 0.0
    s2 = summarize([fast_ttft_slow_tpot], 1.0, goodput_slo_ms={"ttft": 100, "tpot": 500})
    assert s2.request_goodput == 1.0
    assert summarize([fast_ttft_slow_tpot], 1.0).request_goodput is None


def test_peak_concurrency_counts_overlaps() -> None:
    a = rec(0.0, [1.0], usage=1)
    b = rec(0.5, [1.5], usage=1)
    c = rec(1.0, [2.0], usage=1)  # starts exactly when a ends: half-open intervals
    assert summarize([a, b, c], 2.0).max_concurrent_requests == 2


def test_all_failed_gives_zeros_not_a_crash() -> None:
    bad = RequestRecord(ok=False, error_type="timeout")
    s = summarize([bad], 1.0)
    assert s.completed == 0 and s.failed == 1 and s.ttft_ms["mean"] == 0.0


def test_stats_follow_numpy_linear_percentile() -> None:
    xs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    assert percentile(xs, 50) == pytest.approx(3.5)
    assert percentile(xs, 90) == pytest.approx(6.0 + 0.3 * 3.0)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 9.0
    assert mean(xs) == pytest.approx(31 / 8)
    assert std([1.0, 3.0]) == pytest.approx(1.0)  # population std, ddof=0
    assert percentile([], 99) is None


def test_parse_goodput() -> None:
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput(["ttft:500 e2el:2000"]) == {"ttft": 500.0, "e2el": 2000.0}
    for bad in (["ttft=5"], ["itl:5"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
