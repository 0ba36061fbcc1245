"""LoRA adapter slots of one engine, as vLLM runs them. Pure.

vLLM keeps adapters at three levels, and so does this model:

- **registered**: the names the server serves (`--lora-modules`, `POST
  /v1/load_lora_adapter`); a request names one as its `model`.
- **CPU cache**: loaded weights in host memory, at most `max_cpu_loras` (default
  `max_loras`), least recently used evicted first. Loading an adapter from disk
  (`LoraCost.load_s`) blocks the engine: a runtime load (`add`) holds the engine until it
  is done (`busy_until_s`); an adapter evicted from the cache is loaded again when a
  request needs it, in that request's first iteration.
- **GPU slots**: `max_loras` adapters the kernels can use, filled from the CPU cache
  (`LoraCost.activate_s`), the least recently used idle adapter evicted first.

Scheduling (vLLM v1's scheduler): a waiting request is admitted only if its adapter is
already used by the running batch or the batch uses fewer than `max_loras` adapters;
otherwise it is skipped (it keeps its place, and requests behind it may go first). An
iteration pays, beyond the base model's step, the loads and activations it triggered and
the SGMV kernels of its distinct adapters (`LoraCost.step_s`; `gpufleet.perf.lora`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufleet.perf.lora import LoraCost

if TYPE_CHECKING:
    from gpufleet.engine.request import EngineRequest


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """One adapter as a request carries it (vLLM's LoRARequest): it can be loaded again
    from `path` whenever it is needed, even after the server unregistered it."""

    name: str
    path: str = ""
    rank: int = 16


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """vLLM's flags: --max-loras, --max-lora-rank, --max-cpu-loras."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: max_loras

    def __post_init__(self) -> None:
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError("max_loras and max_lora_rank must be >= 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )

    @property
    def cpu_slots(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


class AdapterSlots:
    """The engine's adapters: registered, cached in CPU memory, active in GPU slots."""

    def __init__(self, config: LoraConfig, cost: LoraCost) -> None:
        self.config = config
        self.cost = cost
        self.registered: dict[str, LoraAdapter] = {}
        self._cpu: OrderedDict[str, LoraAdapter] = OrderedDict()  # least recent first
        self._gpu: OrderedDict[str, LoraAdapter] = OrderedDict()  # least recent first
        self.running: dict[str, int] = {}  # running requests per adapter
        self._dropping: set[str] = set()  # removed while in use: out of the GPU when idle
        self._pending_s = 0.0  # loads and activations the next iteration pays
        self.busy_until_s = 0.0  # a runtime load holds the engine until then
        # counters (monotonic)
        self.disk_loads = 0
        self.activations = 0
        self.admissions = 0
        self.gpu_hits = 0  # admissions whose adapter was already in a GPU slot

    # -- registration (the dynamic-LoRA API and --lora-modules) --------------------------
    def check(self, adapter: LoraAdapter) -> None:
        """Raise ValueError (vLLM's message) for an adapter this engine cannot serve."""
        if adapter.rank > self.config.max_lora_rank:
            raise ValueError(
                f"LoRA rank {adapter.rank} is greater than max_lora_rank "
                f"{self.config.max_lora_rank}."
            )

    def add(self, adapter: LoraAdapter, now_s: float) -> float:
        """Register and load `adapter` into the CPU cache at `now_s` (vLLM's add_lora):
        the engine is busy for the returned seconds, counted from `now_s` or the end of a
        load still in progress."""
        self.check(adapter)
        self.registered[adapter.name] = adapter
        self._dropping.discard(adapter.name)
        load_s = self._to_cpu(adapter)
        self.busy_until_s = max(self.busy_until_s, now_s) + load_s
        return load_s

    def remove(self, name: str) -> bool:
        """Unregister `name` and drop its weights (an adapter in use stays in its GPU slot
        until its requests leave the batch). False if it was not registered."""
        adapter = self.registered.pop(name, None)
        self._cpu.pop(name, None)
        if name in self.running:
            self._dropping.add(name)
        else:
            self._gpu.pop(name, None)
        return adapter is not None

    # -- scheduling ------------------------------------------------------------------------
    def can_admit(self, adapter: LoraAdapter) -> bool:
        """vLLM's rule: the batch already uses it, or uses fewer than max_loras adapters."""
        return adapter.name in self.running or len(self.running) < self.config.max_loras

    def admit(self, adapter: LoraAdapter) -> None:
        """A request using `adapter` joins the running batch: its adapter must be in a GPU
        slot by this iteration, which pays for getting it there."""
        name = adapter.name
        self.admissions += 1
        if name in self._gpu:
            self.gpu_hits += 1
            self._touch(name)
        else:
            self._pending_s += self._to_cpu(adapter)
            if len(self._gpu) >= self.config.max_loras:
                self._evict_gpu()
            self._gpu[name] = adapter
            self.activations += 1
            self._pending_s += self.cost.activate_s(adapter.rank)
        self.running[name] = self.running.get(name, 0) + 1

    def release(self, adapter: LoraAdapter) -> None:
        """A request using `adapter` left the running batch (finished, aborted, preempted)."""
        name = adapter.name
        left = self.running.get(name, 0) - 1
        if left > 0:
            self.running[name] = left
            return
        self.running.pop(name, None)
        if name in self._dropping:
            self._dropping.discard(name)
            self._gpu.pop(name, None)
        else:
            self._touch(name)  # its last use, for the LRU order

    def step_extra_s(self, num_tokens: int, start_s: float) -> float:
        """What an iteration of `num_tokens` tokens starting at `start_s` pays beyond the
        base model: a runtime load still holding the engine, the loads and activations its
        admissions triggered, and the SGMV kernels of the batch's adapters."""
        extra = self._pending_s + max(0.0, self.busy_until_s - start_s)
        self._pending_s = 0.0
        if self.running:
            extra += self.cost.step_s(len(self.running), num_tokens)
        return extra

    def step_lora_s(self, num_tokens: int) -> float:
        """The SGMV part alone: what each step of a run of plain decodes pays."""
        return self.cost.step_s(len(self.running), num_tokens) if self.running else 0.0

    def loads_pending(self, start_s: float) -> bool:
        """Whether an iteration starting at `start_s` would pay for a load."""
        return self._pending_s > 0.0 or self.busy_until_s > start_s

    def waiting_adapters(self, waiting: Iterable[EngineRequest]) -> dict[str, int]:
        """Waiting requests per adapter (vllm:lora_requests_info's waiting_lora_adapters)."""
        out: dict[str, int] = {}
        for req in waiting:
            if req.lora is not None:
                out[req.lora.name] = out.get(req.lora.name, 0) + 1
        return out

    # -- views -------------------------------------------------------------------------------
    @property
    def gpu(self) -> tuple[str, ...]:
        """Adapters in GPU slots, least recently used first."""
        return tuple(self._gpu)

    @property
    def cpu(self) -> tuple[str, ...]:
        """Adapters in the CPU cache, least recently used first."""
        return tuple(self._cpu)

    # -- the caches --------------------------------------------------------------------------
    def _to_cpu(self, adapter: LoraAdapter) -> float:
        """Seconds to have `adapter` in the CPU cache (0 if it is there)."""
        name = adapter.name
        if name in self._cpu:
            self._cpu.move_to_end(name)
            return 0.0
        while len(self._cpu) >= self.config.cpu_slots:
            victim = next((n for n in self._cpu if n not in self.running), None)
            if victim is None:
                break  # every cached adapter is in use: hold one more for now
            del self._cpu[victim]
        self._cpu[name] = adapter
        self.disk_loads += 1
        return self.cost.load_s(adapter.rank)

    def _touch(self, name: str) -> None:
        """Used now: the most recent in both caches (vLLM touches them every step)."""
        if name in self._gpu:
            self._gpu.move_to_end(name)
        if name in self._cpu:
            self._cpu.move_to_end(name)

    def _evict_gpu(self) -> None:
        victim = next((n for n in self._gpu if n not in self.running), None)
        if victim is not None:  # the admission rule leaves one idle when the slots are full
            del self._gpu[victim]
