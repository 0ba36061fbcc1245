"""The dataclasses whose `__init__` is written out (mypyc leaves a generated one interpreted,
mypyc/mypyc#817) must take and set exactly their fields, with the fields' defaults: a field
added later to the class but not to its `__init__` fails here, compiled or not."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpufleet.perf.step_batch import StepBatch
from gpufleet.routing.types import RequestInfo
from gpufleet.sim.results import RequestResult

WRITTEN_OUT: list[type[Any]] = [RequestInfo, RequestResult, StepBatch]


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_init_sets_every_field_it_is_given(cls: type[Any]) -> None:
    fields = dataclasses.fields(cls)
    values = {f.name: object() for f in fields}  # a distinct marker per field
    made = cls(**values)
    for f in fields:
        assert getattr(made, f.name) is values[f.name], f.name


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_init_defaults_are_the_fields_defaults(cls: type[Any]) -> None:
    fields = dataclasses.fields(cls)
    required = {f.name: object() for f in fields if f.default is dataclasses.MISSING}
    assert all(f.default_factory is dataclasses.MISSING for f in fields)  # (none use one)
    made = cls(**required)
    for f in fields:
        expected = required.get(f.name, f.default)
        assert getattr(made, f.name) == expected, f.name
