"""Tiling a trace: N interleaved copies, N times its rate over the same span."""

from __future__ import annotations

import pytest

from gpufleet.workload import TraceRecord, tile_records


def test_copies_interleave_at_n_times_the_rate_with_their_own_prefixes() -> None:
    recs = [TraceRecord(0.0, 10, 1, (0, 1)), TraceRecord(1.0, 20, 2, (0, 2)),
            TraceRecord(4.0, 30, 3, None)]  # fmt: skip
    tiled = tile_records(recs, 3)
    assert len(tiled) == 9
    assert [r.arrival_s for r in tiled] == sorted(r.arrival_s for r in tiled)
    assert tiled[-1].arrival_s - tiled[0].arrival_s == pytest.approx(4.0 + 2 * 2.0 / 3)
    firsts = [r for r in tiled if r.input_tokens == 10]
    assert [r.arrival_s for r in firsts] == pytest.approx([0.0, 2 / 3, 4 / 3])
    assert [r.hash_ids for r in firsts] == [(0, 1), (3, 4), (6, 7)]  # no shared prefix
    assert sum(1 for r in tiled if r.hash_ids is None) == 3
    assert tile_records(recs, 1) == recs
    with pytest.raises(ValueError):
        tile_records(recs, 0)
