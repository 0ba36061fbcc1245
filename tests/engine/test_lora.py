"""LoRA in the engine: vLLM's max_loras admission rule, GPU slots and the CPU cache with LRU
eviction, load and SGMV costs in the iteration time (pure, no clock)."""

from __future__ import annotations

import pytest

from gpufleet.engine import Engine, EngineConfig, EngineRequest
from gpufleet.engine.lora import AdapterSlots, LoraAdapter, LoraConfig
from gpufleet.perf.lora import FixedLoraCost
from gpufleet.perf.step_time import LinearStepTimeModel

MODEL = LinearStepTimeModel(base_s=0.01)
COST = FixedLoraCost(load_fixed_s=0.5, activate_fixed_s=0.05, step_fixed_s=0.002,
                     per_adapter_s=0.001)  # fmt: skip
A, B, C = (LoraAdapter(n, f"/adapters/{n}") for n in "abc")


def slots(max_loras: int = 1, max_cpu_loras: int | None = None) -> AdapterSlots:
    return AdapterSlots(LoraConfig(max_loras=max_loras, max_cpu_loras=max_cpu_loras), COST)


def engine(max_loras: int = 1, max_cpu_loras: int | None = None) -> Engine:
    config = EngineConfig(num_gpu_blocks=1024)
    return Engine(config, MODEL, seed=1, lora=slots(max_loras, max_cpu_loras))


def req(rid: str, adapter: LoraAdapter | None, out: int = 3) -> EngineRequest:
    return EngineRequest(rid, [1] * 20, out, lora=adapter)


def test_admission_rule_is_vllms_max_loras() -> None:
    s = slots(max_loras=2)
    assert s.can_admit(A) and s.can_admit(B)
    s.admit(A)
    s.admit(B)
    assert not s.can_admit(C)
    assert s.can_admit(A)  # an adapter the batch already uses always fits
    s.release(A)
    assert s.can_admit(C)


def test_gpu_slots_evict_the_least_recently_used_idle_adapter() -> None:
    s = slots(max_loras=2, max_cpu_loras=3)
    for adapter in (A, B):
        s.admit(adapter)
        s.release(adapter)
    s.admit(A)  # a hit: A becomes the most recent
    s.release(A)
    s.admit(C)  # B is the least recently used: it leaves the GPU
    assert s.gpu == ("a", "c")
    assert s.cpu == ("b", "a", "c")  # still cached in host memory
    assert (s.admissions, s.gpu_hits, s.activations, s.disk_loads) == (4, 1, 3, 3)


def test_cpu_cache_evicts_and_an_evicted_adapter_is_loaded_again() -> None:
    s = slots(max_loras=1, max_cpu_loras=2)
    for adapter in (A, B, C):
        s.admit(adapter)
        assert s.step_extra_s(10, 0.0) == pytest.approx(0.5 + 0.05 + 0.002 + 0.001)
        s.release(adapter)
    assert s.cpu == ("b", "c")
    s.admit(A)  # gone from both caches: disk again (B, the least recent, leaves the cache)
    assert s.disk_loads == 4 and s.cpu == ("c", "a")
    assert s.step_extra_s(10, 0.0) == pytest.approx(0.5 + 0.05 + 0.002 + 0.001)
    s.release(A)
    s.admit(C)  # in the CPU cache: only the slot copy
    assert s.step_extra_s(10, 0.0) == pytest.approx(0.05 + 0.002 + 0.001)


def test_a_runtime_load_holds_the_next_iteration() -> None:
    s = slots()
    assert s.add(A, now_s=1.0) == 0.5
    assert s.busy_until_s == 1.5
    assert s.add(B, now_s=1.2) == 0.5  # after the first one
    assert s.busy_until_s == 2.0
    assert s.step_extra_s(1, 1.5) == pytest.approx(0.5)  # no adapter running: no SGMV
    assert s.step_extra_s(1, 3.0) == 0.0
    with pytest.raises(ValueError, match="greater than max_lora_rank 16"):
        s.add(LoraAdapter("big", rank=64), 0.0)


def test_an_adapter_removed_while_in_use_leaves_its_slot_when_done() -> None:
    s = slots()
    s.add(A, 0.0)
    s.admit(A)
    assert s.remove("a") and not s.remove("a")
    assert s.gpu == ("a",)
    s.release(A)
    assert s.gpu == () and "a" not in s.registered


def test_requests_over_max_loras_wait_while_others_pass_them() -> None:
    e = engine(max_loras=1)
    first, blocked, base = req("a1", A, out=4), req("b1", B, out=2), req("base", None, out=2)
    for r in (first, blocked, base):
        e.add(r)
    out = e.step()
    # b1 is skipped (one slot, taken by a); the base request behind it is admitted.
    assert {r.request_id for r in out.emitted} == {"a1", "base"}
    assert e.num_waiting == 1 and e.lora is not None and e.lora.running == {"a": 1}
    while blocked.first_scheduled_s is None:
        e.step()
    assert first.finished_s is not None and blocked.first_scheduled_s >= first.finished_s
    while e.has_work:
        e.step()
    assert e.lora.running == {} and e.lora.gpu == ("b",)


def test_iteration_times_carry_loads_and_sgmv() -> None:
    e = engine(max_loras=2)
    e.add(req("a1", A, out=2))
    first = e.step()
    # base step + disk load + activation + SGMV (1 adapter)
    assert first.duration_s == pytest.approx(0.01 + 0.5 + 0.05 + 0.002 + 0.001)
    second = e.step()
    assert second.duration_s == pytest.approx(0.01 + 0.002 + 0.001)
    e.add(req("base", None, out=1))
    assert e.step().duration_s == pytest.approx(0.01)  # no adapter in the batch


def test_preempted_and_aborted_requests_give_their_adapter_back() -> None:
    e = engine(max_loras=1)
    e.add(req("a1", A, out=50))
    e.step()
    e.abort("a1")
    assert e.lora is not None and e.lora.running == {}
    e.add(req("b1", B, out=1))
    assert [r.request_id for r in e.step().emitted] == ["b1"]
