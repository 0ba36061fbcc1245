"""The dataclasses whose `__init__` is written out (mypyc leaves a generated one interpreted,
mypyc/mypyc#817) must take and set exactly their fields, with the fields' defaults: a field
added later to the class but not to its `__init__` fails here, compiled or not."""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from typing import Any

import pytest

from gpufleet.fleet_state.engine_metrics import ScrapedMetrics
from gpufleet.fleet_state.lora_metrics import LoraRequestsInfo
from gpufleet.perf.step_batch import StepBatch
from gpufleet.routing.types import RequestInfo
from gpufleet.sim.results import RequestResult

WRITTEN_OUT: list[type[Any]] = [RequestInfo, RequestResult, ScrapedMetrics, StepBatch]


def _distinct_values(cls: type[Any]) -> dict[str, Any]:
    """A value of each field's type (compiled classes check it), distinct per field."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for k, f in enumerate(dataclasses.fields(cls)):
        hint = hints[f.name]
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        base = typing.get_origin(hint) or hint
        if base is type:  # (compiled, an optional field's annotation reads `type`: None fits)
            values[f.name] = None
        elif base in (tuple, collections.abc.Sequence):
            values[f.name] = (k + 1,)
        elif base is bool:  # (before int: a bool is an int; the opposite of the default)
            values[f.name] = f.default is not True
        elif base is LoraRequestsInfo:
            values[f.name] = LoraRequestsInfo(running=(f"v{k}",), max_lora=k)
        elif base is str:
            values[f.name] = f"v{k}"
        elif base is float:
            values[f.name] = k + 0.5
        elif base is int:
            values[f.name] = 1000 + k
        else:
            raise AssertionError(f"{cls.__name__}.{f.name}: no test value for {hint!r}")
    return values


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_init_sets_every_field_it_is_given(cls: type[Any]) -> None:
    values = _distinct_values(cls)
    made = cls(**values)
    for name, value in values.items():
        assert getattr(made, name) == value, name


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_init_defaults_are_the_fields_defaults(cls: type[Any]) -> None:
    fields = dataclasses.fields(cls)
    assert all(f.default_factory is dataclasses.MISSING for f in fields)  # (none use one)
    values = _distinct_values(cls)
    required = {f.name: values[f.name] for f in fields if f.default is dataclasses.MISSING}
    made = cls(**required)
    for f in fields:
        assert getattr(made, f.name) == required.get(f.name, f.default), f.name
