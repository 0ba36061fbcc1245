import itertools
from pathlib import Path

import pytest

from gpufleet.errors import UserError
from gpufleet.workload import read_azure_csv, read_mooncake_jsonl, read_trace


def test_azure_slice() -> None:
    recs = read_azure_csv("sample:azure", limit=50)
    assert len(recs) == 50
    assert recs[0].arrival_s == 0.0
    # first rows: 18:15:46.6805900 and 18:15:50.9951690, 374/44 tokens
    assert recs[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert (recs[0].input_tokens, recs[0].output_tokens) == (374, 44)
    assert all(b.arrival_s >= a.arrival_s for a, b in itertools.pairwise(recs))
    assert all(r.hash_ids is None for r in recs)


def test_mooncake_slice() -> None:
    recs = read_mooncake_jsonl("sample:mooncake", limit=50)
    assert len(recs) == 50
    assert (recs[0].input_tokens, recs[0].output_tokens) == (6758, 500)
    assert recs[0].hash_ids is not None and recs[0].hash_ids[:3] == (0, 1, 2)
    for r in recs:
        assert r.hash_ids is not None
        assert (len(r.hash_ids) - 1) * 512 < r.input_tokens <= len(r.hash_ids) * 512
    assert recs[-1].arrival_s >= recs[0].arrival_s


def test_read_trace_detects_the_format() -> None:
    assert read_trace("sample:mooncake", limit=2)[0].hash_ids is not None
    assert read_trace("sample:azure", limit=2)[0].hash_ids is None


def test_the_shipped_samples_are_whole_and_sorted() -> None:
    for name, span_s in (("sample:mooncake", 900.0), ("sample:azure", 600.0)):
        recs = read_trace(name)
        assert len(recs) == 3000, name
        assert recs[-1].arrival_s > span_s  # minutes of traffic, enough for a sim example
        assert all(b.arrival_s >= a.arrival_s for a, b in itertools.pairwise(recs))
    with pytest.raises(UserError, match="sample:mooncake"):
        read_trace("sample:nope")


def test_gzipped_traces_read_like_plain_ones(tmp_path: Path) -> None:
    import gzip

    row = '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n'
    plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
    plain.write_text(row * 3)
    with gzip.open(packed, "wt") as f:
        f.write(row * 3)
    assert read_trace(packed) == read_trace(plain) and len(read_trace(plain)) == 3


def test_malformed_lines_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 1}\n'
    )
    with pytest.raises(UserError) as e:
        read_trace(bad)
    assert "t.jsonl:2" in str(e.value) and "input_length" in str(e.value)
    assert e.value.field == "--trace"

    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,x\n")
    with pytest.raises(UserError) as e:
        read_trace(csv)
    assert "t.csv:2" in str(e.value)

    other = tmp_path / "t.txt"
    other.write_text("hello\n")
    with pytest.raises(UserError):
        read_trace(other)
    with pytest.raises(UserError):
        read_trace(tmp_path / "missing.csv")
