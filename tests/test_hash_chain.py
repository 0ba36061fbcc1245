"""`HashChain` answers every read the engine makes as the list of its hashes would."""

from __future__ import annotations

import random

import pytest

from gpufleet.hash_runs import HashChain, chain_runs


@pytest.mark.parametrize("seed", range(10))
def test_hash_chain_reads_as_its_list(seed: int) -> None:
    rng = random.Random(seed)
    hashes = [rng.randrange(2**63) for _ in range(3)]
    hashes += range(hashes[-1] + 1, hashes[-1] + 1 + rng.randrange(1, 40))
    chain = HashChain(chain_runs(hashes))
    for _ in range(40):
        op = rng.random()
        if op < 0.4:  # an answer's blocks: a range, often running on
            start = hashes[-1] + 1 if rng.random() < 0.5 else rng.randrange(2**64)
            more: range | list[int] = range(start, start + rng.randrange(0, 5))
        elif op < 0.6:
            more = [rng.randrange(2**63) for _ in range(rng.randrange(0, 30))]
        else:
            more = range(0)
        chain += more
        hashes += more
        assert len(chain) == len(hashes) and bool(chain) == bool(hashes)
        assert chain == hashes and list(chain) == hashes
        i = rng.randrange(-len(hashes), len(hashes))
        assert chain[i] == hashes[i]
        a, b = sorted(rng.randrange(-len(hashes) - 2, len(hashes) + 2) for _ in range(2))
        assert chain[a:b] == hashes[a:b] and chain[:b] == hashes[:b] and chain[a:] == hashes[a:]
        assert chain + [7] == [*hashes, 7]  # noqa: RUF005 (`+` is what is tested)
        assert sum(n for _, n in chain.runs) == len(hashes)
        assert chain.runs == chain_runs(hashes)  # (merged where they run on)
    with pytest.raises(IndexError):
        chain[len(hashes)]


def test_an_empty_chain() -> None:
    chain = HashChain()
    assert not chain and len(chain) == 0 and chain == [] and chain[:3] == []
    chain += range(5, 7)
    assert chain == [5, 6] and chain.runs == [(5, 2)]
