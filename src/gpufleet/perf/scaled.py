"""A step-time model slowed by a constant factor: what `gpufleet replica --time-scale X`
runs (every engine iteration takes X times its modelled time), for the simulator to
replay a slowed replica on the same clock as the live one."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.perf.step_time import StepBatch, StepTimeModel


@dataclass(frozen=True, slots=True)
class ScaledStepTimeModel:
    model: StepTimeModel
    factor: float

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"time scale must be > 0, got {self.factor}")

    def step_time_s(self, batch: StepBatch) -> float:
        return self.model.step_time_s(batch) * self.factor


def scaled(model: StepTimeModel, factor: float) -> StepTimeModel:
    """`model` slowed `factor` times (itself when the factor is 1)."""
    return model if factor == 1.0 else ScaledStepTimeModel(model, factor)
