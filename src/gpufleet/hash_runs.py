"""Runs of consecutive ints in chains of block hashes, and an index of runs. Pure.

The simulator's prompts hash a segment's blocks as base + i, and number a trace's new
blocks from a counter (`gpufleet.workload.segments`), so a prompt's chain of ~750 block
hashes is a few runs of consecutive ints. The engine's block pool and the router's prefix
index keep what they hold as such runs and do a few steps per run instead of one per
block. Other chains (real token hashes) are runs of one: still right, only slower.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Generic, Protocol, TypeVar, overload

import numpy as np

from gpufleet.native import mypyc_attr

Runs = list[tuple[int, int]]  # (first hash, count)
_SHORT = 24  # chains this short: found in Python
_INT64_MIN = -(2**63)


@mypyc_attr(native_class=False)  # (compiled: a native class cannot subclass list)
class RunList(list[int]):
    """A chain of hashes that knows its runs (`runs`), as its maker found them."""

    __slots__ = ("runs",)

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.runs: Runs = []


class HashChain(Sequence[int]):
    """A chain of hashes held as its runs only, with no int object per hash: a prompt of
    ~750 engine blocks is a few runs. It answers the reads a list of the hashes would
    (length, an item, a slice, iteration, `+=`), each in a few steps per run; `runs` are
    its own copy of those it was made of, merged with what `+=` adds where that runs on. (Building the list only to read its
    length and a hash or two took a tenth of the simulator's time on Mooncake.)"""

    __slots__ = ("_len", "runs")

    def __init__(self, runs: Iterable[tuple[int, int]] = ()) -> None:
        self.runs: Runs = list(runs)  # (its own: `+=` changes it)
        total = 0
        for _, n in self.runs:
            total += n
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._len)
            if step != 1:
                return list(self)[i]
            return run_hashes(slice_runs(self.runs, start, stop)) if stop > start else []
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("chain position out of range")
        h, n = self.runs[-1]
        if i >= self._len - n:  # (the last run: the one read most)
            return h + i - (self._len - n)
        return hash_at(self.runs, i)

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable([range(h, h + n) for h, n in self.runs])

    def add_run(self, first: int, count: int) -> None:
        """Append hashes first..first+count-1 (an answer's blocks: one run)."""
        if count > 0:
            self._len += count
            append_run(self.runs, first, count)

    def extend(self, more: Iterable[int]) -> None:
        runs = self.runs
        if type(more) is range and more.step == 1:
            self.add_run(more.start, len(more))
            return
        if isinstance(more, HashChain):
            tail = list(more.runs)
        else:
            hashes = list(more)
            if 0 < len(hashes) <= 2 and hashes[-1] == hashes[0] + len(hashes) - 1:
                self.add_run(hashes[0], len(hashes))  # (a block or two of an answer)
                return
            tail = chain_runs(hashes)
        if tail:
            self._len += sum(n for _, n in tail)
            _run_on(runs, tail)

    def __iadd__(self, more: Iterable[int]) -> HashChain:
        self.extend(more)
        return self

    def __add__(self, more: Iterable[int]) -> list[int]:
        return [*self, *more]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HashChain):
            return self._len == other._len and list(self) == list(other)
        if isinstance(other, list | tuple):
            return len(other) == self._len and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (it changes: as a list)

    def __repr__(self) -> str:
        return f"HashChain({self.runs!r})"


def run_hashes(runs: Runs) -> list[int]:
    """The chain `runs` stand for, as a new list."""
    if not runs:
        return []
    h, n = runs[0]
    out = list(range(h, h + n))  # (built at its size: faster than growing a list)
    for h, n in runs[1:]:
        out += range(h, h + n)
    return out


def hash_at(runs: Runs, i: int) -> int:
    """The hash at chain position i (0 <= i < the runs' total count)."""
    for h, n in runs:
        if i < n:
            return h + i
        i -= n
    raise IndexError("chain position out of range")


def runs_known(hashes: Sequence[int]) -> Runs | None:
    """The runs a chain knows (`HashChain`, and a `RunList` still as made), else None."""
    runs: Runs | None = getattr(hashes, "runs", None)
    if runs is not None and type(hashes) is RunList and sum(n for _, n in runs) != len(hashes):
        return None  # (a list grown or cut since)
    return runs


def runs_of(hashes: Sequence[int], head: Runs | None) -> Runs:
    """The runs of `hashes`, `head` being those of its first hashes (None: none known)."""
    runs = list(head or [])
    covered = sum(n for _, n in runs)
    if covered < len(hashes):
        _run_on(runs, chain_runs(hashes, covered))
    return runs


def cut_runs_on(runs: Runs, k: int, base: int, n: int) -> Runs:
    """The runs of the chain's first k hashes, then base..base+n-1."""
    out = slice_runs(runs, 0, k)
    if n > 0:
        _run_on(out, [(base, n)])
    return out


def append_run(runs: Runs, first: int, count: int) -> None:
    """Append hashes first..first+count-1 to `runs`, as part of the last run if it runs on."""
    if runs:
        last, n = runs[-1]
        if last + n == first:
            runs[-1] = (last, n + count)
            return
    runs.append((first, count))


def _run_on(runs: Runs, more: Runs) -> None:
    """Append `more` to `runs`, merging the two that meet if they run on."""
    if runs and more and runs[-1][0] + runs[-1][1] == more[0][0]:
        runs[-1] = (runs[-1][0], runs[-1][1] + more[0][1])
        more = more[1:]
    runs += more


def consecutive(hashes: Sequence[int], i: int, limit: int) -> int:
    """How many of hashes[i:i+limit] (limit >= 1) run on as hashes[i], hashes[i] + 1, ...
    (compared in chunks that double: C speed, cost grows with the run found)."""
    h = hashes[i]
    end = i + limit
    if hashes[end - 1] == h + limit - 1 and hashes[i:end] == list(range(h, h + limit)):
        return limit
    k, size = 1, 8
    while k < limit:
        m = min(size, limit - k)
        a = i + k
        if hashes[a + m - 1] == h + k + m - 1 and hashes[a : a + m] == list(
            range(h + k, h + k + m)
        ):
            k += m
            size *= 2
            continue
        for j in range(a, a + m):
            if hashes[j] != h + j - i:
                return j - i
        return k + m  # (not reached: the chunk differs somewhere)
    return k


def chain_runs(hashes: Sequence[int], start: int = 0, stop: int | None = None) -> Runs:
    """hashes[start:stop] as (first, count) runs of consecutive ints, in order (numpy finds
    the breaks: a few ns a hash)."""
    stop = len(hashes) if stop is None else stop
    n = stop - start
    if n <= _SHORT:
        return chain_runs_slow(hashes, start, stop)
    try:
        a = np.array(hashes[start:stop], dtype=np.int64)
    except OverflowError:  # (not 64-bit hashes)
        return chain_runs_slow(hashes, start, stop)
    # a break where the next is not one more (a wrap from the largest int64 is not)
    breaks = np.flatnonzero((np.diff(a) != 1) | (a[1:] == _INT64_MIN)).tolist()
    out: Runs = []
    first = 0
    for b in breaks:
        out.append((hashes[start + first], b + 1 - first))
        first = b + 1
    out.append((hashes[start + first], n - first))
    return out


def chain_runs_slow(hashes: Sequence[int], start: int, stop: int) -> Runs:
    out: Runs = []
    while start < stop:
        k = consecutive(hashes, start, stop - start)
        out.append((hashes[start], k))
        start += k
    return out


def slice_runs(runs: Runs, start: int, stop: int) -> Runs:
    """The runs of chain positions start..stop-1, given the runs of the whole chain."""
    out: Runs = []
    pos = 0
    for h, n in runs:
        end = pos + n
        if end > start:
            a, b = max(pos, start), min(end, stop)
            if b > a:
                out.append((h + a - pos, b - a))
            if end >= stop:
                break
        pos = end
    return out


class Run(Protocol):
    start: int
    size: int


R = TypeVar("R", bound=Run)


class RunIndex(Generic[R]):
    """Runs that never overlap (each holds hashes start..start+size-1), found by hash."""

    __slots__ = ("_runs", "_starts")

    def __init__(self) -> None:
        self._runs: dict[int, R] = {}
        self._starts: list[int] = []  # the runs' first hashes, sorted

    def __len__(self) -> int:
        return len(self._runs)

    def values(self) -> list[R]:
        return list(self._runs.values())

    def clear(self) -> None:
        self._runs.clear()
        self._starts.clear()

    def find(self, h: int) -> R | None:
        """The run holding hash h, if any."""
        run = self._runs.get(h)
        if run is not None:
            return run
        starts = self._starts
        i = bisect_right(starts, h) - 1
        if i >= 0:
            run = self._runs[starts[i]]
            if h < run.start + run.size:
                return run
        return None

    def next_start(self, h: int, end: int) -> int:
        """The first hash after h that starts a run, or `end` if none comes before it."""
        starts = self._starts
        j = bisect_right(starts, h)
        return min(end, starts[j]) if j < len(starts) else end

    def pieces(self, h: int, n: int) -> list[tuple[R | None, int, int]]:
        """Hashes h..h+n-1 cut where runs begin and end: (run or None, first, stop)."""
        end = h + n
        runs, starts = self._runs, self._starts
        out: list[tuple[R | None, int, int]] = []
        while h < end:  # (`find` and `next_start` written out: every routing decision)
            run = runs.get(h)
            if run is None:
                i = bisect_right(starts, h)
                if i:
                    run = runs[starts[i - 1]]
                    if h >= run.start + run.size:
                        run = None
                if run is None:
                    b = starts[i] if i < len(starts) and starts[i] < end else end
                    out.append((None, h, b))
                    h = b
                    continue
            b = run.start + run.size
            if b > end:
                b = end
            out.append((run, h, b))
            h = b
        return out

    def add(self, run: R) -> None:
        self._runs[run.start] = run
        insort(self._starts, run.start)

    def replace(self, run: R, new: R) -> None:
        """Put `new` in the place of `run`, which starts where it does."""
        assert new.start == run.start
        self._runs[new.start] = new

    def drop(self, run: R) -> None:
        del self._runs[run.start]
        starts = self._starts
        del starts[bisect_right(starts, run.start) - 1]

    def move(self, run: R, start: int, size: int) -> None:
        """Make `run` hold start..start+size-1 (within what it held)."""
        if start != run.start:
            self.drop(run)
            run.start = start
            run.size = size
            self.add(run)
        else:
            run.size = size
