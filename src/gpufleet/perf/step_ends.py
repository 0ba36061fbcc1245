"""When each step of a decode run ends, kept as the array they were summed in. Pure.

A jump over a decode run sums a few hundred step times (numpy, in step order) and is then
read at one or two steps: its last (when it ends), or where an arrival cuts it. Making a
float object for every step (`tolist`) cost more than the sum (Azure x10: 2.5 M floats
for 16 k runs); `StepEnds` makes one only for a step that is read.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any, cast, overload


class StepEnds(Sequence[float]):
    """A read-only sequence of step end times (s) over a float64 array, read through a
    memoryview (each read gives the Python float `tolist` would, and `bisect` searches it
    in C)."""

    __slots__ = ("_len", "_view")

    def __init__(self, view: memoryview) -> None:
        self._view = view  # (of float64: `ndarray.data`)
        self._len = len(view)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> float: ...

    @overload
    def __getitem__(self, i: slice) -> StepEnds: ...

    def __getitem__(self, i: int | slice) -> float | StepEnds:
        got: Any = self._view[i]
        return got if type(got) is float else StepEnds(got)

    def __iter__(self) -> Iterator[float]:
        return iter(self.tolist())

    def tolist(self) -> list[float]:
        return cast(list[float], self._view.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepEnds | list | tuple):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StepEnds({self.tolist()!r})"


def steps_ended_by(ends: Sequence[float], t_s: float, hi: int) -> int:
    """`bisect.bisect_right(ends, t_s, 0, hi)`: how many of the first `hi` steps end at or
    before `t_s` (ends are in order)."""
    if type(ends) is StepEnds:
        return bisect.bisect_right(cast(Sequence[float], ends._view), t_s, 0, hi)
    return bisect.bisect_right(ends, t_s, 0, hi)
