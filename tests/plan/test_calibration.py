"""The shipped step-time constants sit inside their physical bounds, none pressed against
one (a fit that presses a constant to a bound is compensating for what the model lacks)."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.perf import calibration
from gpufleet.perf.calibration import (
    BACKEND_CONSTANTS,
    BOUNDS,
    PRIOR_BACKENDS,
    SCALAR_CONSTANTS,
    Calibration,
    default_calibration,
    prior_calibration,
)

MARGIN = 0.01  # of the bound's range: closer than this to a bound counts as pinned

# Pinned today, each a gap in the model the fit compensates for (reported, not hidden:
# strict, so the test fails as soon as one comes off its bound and must leave this list).
KNOWN_PINNED: dict[str, str] = {}


def _constants() -> list[tuple[str, float]]:
    cal = default_calibration()
    out = [(name, float(getattr(cal, name))) for name in SCALAR_CONSTANTS]
    for backend, values in sorted(cal.backends.items()):
        out += [(f"{backend}.{k}", float(v)) for k, v in dataclasses.asdict(values).items()]
    return out


def test_every_constant_has_bounds() -> None:
    assert set(BOUNDS) == set(SCALAR_CONSTANTS) | set(BACKEND_CONSTANTS)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param(n, v, marks=pytest.mark.xfail(reason=KNOWN_PINNED[n], strict=True))
        if n in KNOWN_PINNED
        else (n, v)
        for n, v in _constants()
    ],
)
def test_no_constant_is_pinned_at_a_bound(name: str, value: float) -> None:
    low, high = BOUNDS[name.rsplit(".", 1)[-1]]
    slack = MARGIN * (high - low)
    assert low + slack < value < high - slack, (
        f"{name} = {value:g} at its bound [{low:g}, {high:g}]"
    )


def _prior_constants(cal: Calibration) -> list[tuple[str, float]]:
    out = [(name, float(getattr(cal, name))) for name in SCALAR_CONSTANTS]
    for backend, values in sorted(cal.backends.items()):
        out += [(f"{backend}.{k}", float(v)) for k, v in dataclasses.asdict(values).items()]
    return out


def test_prior_is_inside_its_bounds_for_every_engine() -> None:
    prior = prior_calibration()
    assert set(PRIOR_BACKENDS) <= set(prior.backends)
    for name, value in _prior_constants(prior):
        low, high = BOUNDS[name.rsplit(".", 1)[-1]]
        assert low <= value <= high, f"prior {name} = {value:g} outside [{low:g}, {high:g}]"


def test_prior_does_not_read_the_fitted_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prior is data-independent: it neither calls default_calibration() nor reads
    data/calibration.yaml (which was fitted on the measured rows)."""
    expected = prior_calibration()

    def no_file(*_: object, **__: object) -> None:
        raise AssertionError("the prior read the fitted calibration")

    monkeypatch.setattr(calibration, "default_calibration", no_file)
    monkeypatch.setattr(calibration.resources, "files", no_file)
    assert calibration.prior_calibration() == expected
    assert expected != default_calibration()  # not the fitted constants under another name
