"""What the block pool and the KV cache manager pass around: runs of cached blocks.

A `Run` is hashes start..start+size-1 cached at as many blocks (the pool's unit), `Blocks`
the cached prefix found for a request, `Held` what a request holds, in token order.
"""

from __future__ import annotations

from gpufleet.hash_runs import HashChain


class Run:
    """Hashes start..start+size-1, cached at `size` blocks with `refs` references each;
    when free (refs 0) they wait in the queue under the entry (run, gen)."""

    __slots__ = ("gen", "refs", "size", "start")

    def __init__(self, start: int, size: int, refs: int) -> None:
        self.start = start
        self.size = size
        self.refs = refs
        self.gen = 0


class Blocks:
    """Cached blocks found for a request (`cached_prefix`): runs of consecutive hashes,
    (first hash, count), in chain order; `len` is the number of blocks."""

    __slots__ = ("num", "runs")

    def __init__(self, runs: list[tuple[int, int]], num: int) -> None:
        self.runs = runs
        self.num = num

    def __len__(self) -> int:
        return self.num


NO_BLOCKS = Blocks([], 0)
# What a request holds, in token order: (first hash, count) for cached blocks, (None,
# count) for blocks that hold no cached hash.
Held = list[tuple[int | None, int]]


def append_held(held: Held, h: int | None, n: int) -> None:
    """Add n blocks holding h.. (None: nothing) to a request's `held`, merging runs."""
    if held:
        last, m = held[-1]
        if (last is None and h is None) or (last is not None and h is not None and last + m == h):
            held[-1] = (last, m + n)
            return
    held.append((h, n))


def extend_chain(hashes: list[int] | HashChain, base: int, stop: int) -> None:
    """`hashes.extend(range(base + len(hashes), base + stop))`: a counted answer's blocks.
    (A HashChain's run is added at once: compiled, building the range and reading its
    start, step and length back by name cost ~1,000 instructions a decode run.)"""
    have = len(hashes)
    if isinstance(hashes, HashChain):
        hashes.add_run(base + have, stop - have)
    else:
        hashes.extend(range(base + have, base + stop))
