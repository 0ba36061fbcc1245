"""run_benchmark against a real local server on 127.0.0.1 (the in-process stub)."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpufleet.bench.config import BenchConfig
from gpufleet.bench.runner import run_benchmark
from gpufleet.bench.stub import StubBehaviour
from gpufleet.errors import UserError
from gpufleet.workload import Conversation, Turn

from .conftest import InProcessStub, start_in_process

pytestmark = pytest.mark.process  # every test here starts processes or servers


async def test_open_loop_completions_with_goodput_and_server_deltas(stub: InProcessStub) -> None:
    cfg = BenchConfig(
        url=stub.url + "/v1",
        rate=200.0,
        num_requests=30,
        input_tokens=16,
        output_tokens=6,
        range_ratio=0.5,
        goodput_slo_ms={"ttft": 10_000, "tpot": 10_000},
    )
    seen: list[tuple[int, int, int | None]] = []
    report = await run_benchmark(cfg, on_progress=lambda *a: seen.append(a))
    m = report.metrics
    assert m.completed == 30 and m.failed == 0
    assert report.config["model"] == "stub-model"  # resolved from /v1/models
    assert m.request_goodput == pytest.approx(m.request_throughput)
    assert m.total_output_tokens == stub.server.generated_tokens
    assert m.total_input_tokens == stub.server.prompt_tokens  # usage.prompt_tokens
    assert report.server is not None
    assert report.server.known()["generation_tokens"] == m.total_output_tokens
    assert seen[-1] == (30, 0, 30)
    assert m.ttft_ms["mean"] > 0 and m.tpot_ms["mean"] > 0
    assert len(report.ttfts_s) == 30
    json.dumps(report.to_dict())  # JSON-serialisable


async def test_closed_loop_chat_sessions_carry_history(stub: InProcessStub) -> None:
    cfg = BenchConfig(
        url=stub.url,
        endpoint="chat",
        concurrency=2,
        sessions=3,
        turns=3,
        input_tokens=5,
        output_tokens=4,
    )
    report = await run_benchmark(cfg)
    m = report.metrics
    assert m.completed == 9 and m.failed == 0
    # prompt of turn k: k user messages of 5 words, k-1 answers of 4 words, 2 markers each, +1
    per_session = sum(5 * k + 4 * (k - 1) + 2 * (2 * k - 1) + 1 for k in (1, 2, 3))
    assert m.total_input_tokens == 3 * per_session
    assert m.max_concurrent_requests <= 2


async def test_prefix_groups_trace_and_max_concurrency(stub: InProcessStub, tmp_path) -> None:
    cfg = BenchConfig(
        url=stub.url,
        max_concurrency=3,
        num_requests=12,
        prefix_groups=3,
        prefix_tokens=20,
        input_tokens=5,
        output_tokens=3,
    )
    report = await run_benchmark(cfg)
    assert report.metrics.completed == 12
    assert report.metrics.total_input_tokens == 12 * 25
    assert report.metrics.max_concurrent_requests <= 3
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {"timestamp": 5 * i, "input_length": 600, "output_length": 3, "hash_ids": [0, i]}
            )
            + "\n"
            for i in range(6)
        )
    )
    report = await run_benchmark(BenchConfig(url=stub.url, trace=str(trace), speedup=10.0))
    assert report.metrics.completed == 6 and report.metrics.total_input_tokens == 3600


async def test_timed_closed_loop_stops_sending(stub: InProcessStub) -> None:
    cfg = BenchConfig(url=stub.url, concurrency=2, duration_s=0.3, input_tokens=4, output_tokens=2)
    report = await run_benchmark(cfg)
    assert report.metrics.completed > 0 and report.metrics.failed == 0


async def test_warmup_requests_are_sent_but_not_measured(stub: InProcessStub) -> None:
    cfg = BenchConfig(
        url=stub.url, num_requests=5, warmup_requests=3, input_tokens=4, output_tokens=2
    )
    report = await run_benchmark(cfg)
    assert stub.server.requests == 8
    assert report.metrics.completed == 5
    assert report.server is not None
    assert report.server.known()["generation_tokens"] == 5 * 2  # scraped after the warm-up


async def test_custom_conversations_and_explicit_model(stub: InProcessStub) -> None:
    convs = [Conversation(i, (Turn("ba be bi", 3, 2),)) for i in range(4)]
    seen: list[tuple[int, int, int | None]] = []
    report = await run_benchmark(
        BenchConfig(url=stub.url, model="m", rate=100.0),
        conversations=convs,
        on_progress=lambda *a: seen.append(a),
    )
    assert report.metrics.completed == 4 and report.config["model"] == "m"
    assert seen[-1] == (4, 0, 4)  # a sized workload gives the progress bar its total


async def test_faults_are_classified_never_fatal() -> None:
    runner, s = await start_in_process(
        StubBehaviour(fail_every=4, malformed_every=5, include_usage=False, model="x")
    )
    try:
        report = await run_benchmark(
            BenchConfig(url=s.url, num_requests=20, input_tokens=3, output_tokens=4)
        )
    finally:
        await runner.cleanup()
    m = report.metrics
    kinds = {(f.status, f.error_type): f.count for f in m.failures}
    # requests 4, 8, 12, 16, 20 get 429; 5, 10, 15 break mid-stream
    assert kinds == {(429, "RateLimitError"): 5, (200, "malformed_chunk"): 3}
    assert m.completed == 12
    assert m.total_output_tokens == 12 * 4  # no usage: counted from the text


async def test_a_stream_cut_mid_way_is_a_truncated_stream() -> None:
    runner, s = await start_in_process(StubBehaviour(disconnect_every=3))
    try:
        report = await run_benchmark(
            BenchConfig(url=s.url, concurrency=2, num_requests=9, input_tokens=3, output_tokens=6)
        )
    finally:
        await runner.cleanup()
    kinds = {(f.status, f.error_type): f.count for f in report.metrics.failures}
    assert kinds == {(200, "truncated_stream"): 3}
    assert report.metrics.completed == 6


async def test_unreachable_target() -> None:
    with pytest.raises(UserError) as e:
        await run_benchmark(BenchConfig(url="http://127.0.0.1:9", num_requests=2))
    assert e.value.field == "--model"
    report = await run_benchmark(BenchConfig(url="http://127.0.0.1:9", model="m", num_requests=2))
    assert report.metrics.failed == 2 and report.metrics.failures[0].error_type == "connect_error"
    assert report.server is None and "unreachable" in report.server_note


async def test_timed_open_loop_and_ramp(stub: InProcessStub) -> None:
    timed = await run_benchmark(
        BenchConfig(url=stub.url, rate=100.0, duration_s=0.2, input_tokens=4, output_tokens=2)
    )
    assert timed.metrics.completed >= 1 and timed.metrics.failed == 0
    ramp = await run_benchmark(
        BenchConfig(
            url=stub.url, ramp=(50.0, 400.0), num_requests=15, input_tokens=4, output_tokens=2
        )
    )
    assert ramp.metrics.completed == 15
    assert ramp.config["ramp"] == (50.0, 400.0)


async def test_stop_ends_the_run_and_reports_what_finished(stub: InProcessStub) -> None:
    stop = asyncio.Event()

    def progress(done: int, failed: int, total: int | None) -> None:
        if done >= 3:
            stop.set()

    cfg = BenchConfig(
        url=stub.url, concurrency=2, num_requests=200, input_tokens=4, output_tokens=20
    )
    report = await run_benchmark(cfg, on_progress=progress, stop=stop)
    assert report.interrupted and report.to_dict()["interrupted"] is True
    assert 3 <= report.metrics.completed < 200
    assert report.metrics.failed == 0  # cancelled requests are not failures
