"""benchmarks/plan_high_load.py: Little's law on a row, its what-ifs, its report (no timing)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from gpufleet.validation import measured
from gpufleet.validation.measured import predict_rows, read_rows
from gpufleet.validation.what_if import SHIPPED, WhatIf, running_cap

from .helpers import CONFIGS, SAMPLE, benchmark_module


@pytest.fixture(scope="module")
def high_load() -> Iterator[ModuleType]:
    with benchmark_module("plan_high_load") as module:
        yield module


def _trtllm_ttft_s(what_if: WhatIf = SHIPPED) -> dict[str, float]:
    measured._KV_CACHE.clear()
    preds, _ = predict_rows(read_rows(SAMPLE), None, CONFIGS, what_if=what_if)
    measured._KV_CACHE.clear()
    return {p.row.id: p.ttft_s for p in preds if p.row.backend == "trtllm"}


def test_little_splits_the_clients_into_decoding_and_waiting(high_load: ModuleType) -> None:
    # TRT-LLM rc3 Llama-8B, TP 8, 1024/512 at 128 clients: 2.02 s TTFT, 10.2 ms TPOT.
    m = high_load.little(128, 512, 2.02, 0.0102)
    assert m["decoding"] + m["waiting"] == pytest.approx(128)
    assert m["decoding"] == pytest.approx(92.2, abs=0.1)
    assert m["output_tokens_per_s"] == pytest.approx(m["requests_per_s"] * 512)


def test_a_running_cap_holds_clients_out_of_the_engine() -> None:
    base = _trtllm_ttft_s()
    capped = _trtllm_ttft_s(WhatIf(row_rules=running_cap("trtllm", 2)))
    assert base and capped.keys() == base.keys()
    # 8 clients, 2 running: the other 6 wait a share of the cycle before their prompt.
    assert all(capped[k] > base[k] * 1.5 for k in base)
    assert _trtllm_ttft_s() == base  # nothing carried over to the next call
    # Another engine's cap leaves TRT-LLM's rows as shipped.
    assert _trtllm_ttft_s(WhatIf(row_rules=running_cap("vllm", 2))) == base


def test_a_front_end_paying_per_prompt_token_binds_through_the_ceiling(
    high_load: ModuleType,
) -> None:
    base = _trtllm_ttft_s()
    free = _trtllm_ttft_s(WhatIf(closed_loop=high_load.prompt_frontend(0.0)))
    assert free == pytest.approx(base)
    # 1 ms a prompt token: ~1 request/s.
    slow = _trtllm_ttft_s(WhatIf(closed_loop=high_load.prompt_frontend(1e-3)))
    assert all(slow[k] > base[k] * 2 for k in base)
    assert _trtllm_ttft_s() == base


def test_run_reports_shares_bands_and_what_ifs(high_load: ModuleType) -> None:
    report = high_load.run(SAMPLE, CONFIGS)
    assert report["rows_modelled"] == 8 and report["rows_unmodelled"] == 1
    shipped = report["what_ifs"]["shipped"]
    assert shipped["objective"] > 0 and shipped["focus_ttft_median_ape_pct"] is None
    assert shipped["ttft_median_ape_pct"] == report["share"]["ttft_median_ape_pct"]
    assert sum(b["rows"] for b in report["bands"].values()) == 8
    text = high_load.markdown(report)
    assert "| what-if | TTFT % |" in text and "| engine, clients |" in text
