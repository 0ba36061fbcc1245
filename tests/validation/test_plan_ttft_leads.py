"""benchmarks/plan_ttft_leads.py: the one-slot-fewer diagnostic touches only its campaign."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from gpufleet.perf.calibration import default_calibration
from gpufleet.validation.measured import read_rows

from .helpers import SAMPLE, benchmark_module


@pytest.fixture(scope="module")
def leads() -> Iterator[ModuleType]:
    with benchmark_module("plan_ttft_leads") as module:
        yield module


def test_one_slot_fewer_adds_a_wait_to_that_campaign_only(leads: ModuleType) -> None:
    rows = read_rows(SAMPLE)
    cal = default_calibration()
    plain = {p.row.id: p for p in leads.predict(rows, cal, slots=False)}
    slots = {p.row.id: p for p in leads.predict(rows, cal, slots=True)}
    assert plain.keys() == slots.keys() and len(plain) == len(rows) - 1  # unknown GPU row
    campaign = [i for i, p in plain.items() if leads.is_l8_rc3(p.row)]
    assert len(campaign) == 4
    for i, p in plain.items():
        if i in campaign:  # one client always queued: its wait lengthens the first token
            assert slots[i].ttft_s > p.ttft_s + 0.05
        else:
            assert slots[i].ttft_s == p.ttft_s and slots[i].tpot_s == p.tpot_s


def test_the_table_scans_the_overheads_with_and_without_the_wait(leads: ModuleType) -> None:
    table = leads.slot_table(read_rows(SAMPLE), default_calibration())
    assert len(table) == 2 * len(leads.TRTLLM_OVERHEADS_S)
    assert {t["one_slot_fewer"] for t in table} == {False, True}
    assert all(t["ttft"] >= 0 and t["tpot"] >= 0 and "trtllm L8 rc3" in t for t in table)
    assert "| one slot fewer (L8 rc3) |" in leads.render(table, [])


def test_first_token_forms_with_both_terms_beat_either_alone(leads: ModuleType) -> None:
    forms = leads.first_token_forms(read_rows(SAMPLE), default_calibration())
    assert {f["group"] for f in forms} == {"vllm dense", "trtllm dense"}
    for f in forms:  # "both" searches the same grids jointly (0 included in each)
        assert 0.0 <= f["both"] <= min(f["const"], f["iters"]) + 1e-9
        assert f["rows"] == 4  # the sample: four Llama-70B vLLM rows, four Llama-8B TRT-LLM
