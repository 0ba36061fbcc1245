"""No 5xx from bad input: the fuzz corpus (gpufleet.bench.fuzz, > 2,000 cases) against the
gateway in front of real replicas, spread over every routing policy (a tenant per policy),
must give 0 answers of 5xx, 0 non-JSON 4xx and 0 dropped connections."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufleet.bench.fuzz import FuzzCase, corpus, run_corpus, summarize
from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.replica.testing import DEFAULT_MODEL, ReplicaProcess
from gpufleet.routing import POLICY_NAMES
from gpufleet.routing.types import ReplicaState

from .conftest import wait_until

pytestmark = pytest.mark.process  # starts replica processes and a gateway


def _keyed(case: FuzzCase, key: bytes) -> FuzzCase:
    """The case with a tenant key on its first request (unless it brings its own)."""
    first = case.chunks[0]
    line_end = first.find(b"\r\n")
    if line_end < 0 or b"authorization:" in first.lower():
        return case
    header = b"\r\nAuthorization: Bearer " + key
    chunks = (first[:line_end] + header + first[line_end:], *case.chunks[1:])
    return FuzzCase(case.klass, case.name, chunks, case.answers, case.gap_s, case.half_close)


def test_the_corpus_is_big_deterministic_and_covers_every_class() -> None:
    cases = corpus(DEFAULT_MODEL)
    assert len(cases) >= 2000
    assert cases == corpus(DEFAULT_MODEL)
    classes = Counter(c.klass for c in cases)
    assert set(classes) >= {"deep_nesting", "lone_surrogates", "invalid_utf8", "huge_numbers",
                            "nan_inf", "wrong_types", "oversized_headers", "oversized_bodies",
                            "pipelining", "half_closed", "slowloris"}  # fmt: skip


async def test_no_5xx_no_plain_4xx_no_drop_under_every_policy() -> None:
    replicas = [ReplicaProcess("--step-time", "base_s=0.0002") for _ in range(2)]
    policies = sorted(POLICY_NAMES)
    tenants = [{"name": p, "api_keys": [f"sk-{p}"], "policy": p} for p in policies]
    gw = Gateway(validate_config({
        "replicas": [{"url": r.url} for r in replicas],
        "tenants": tenants,
        "admin_key": "fuzz-admin",
        "limits": {"client_body_timeout_s": 0.5},
        "health": {"probe_interval_s": 0.2},
    }))  # fmt: skip
    try:
        await gw.start("127.0.0.1", 0)
        assert gw.port is not None
        await wait_until(lambda: all(r.state is ReplicaState.READY for r in gw.replicas))
        cases = [_keyed(c, f"sk-{policies[i % len(policies)]}".encode())
                 for i, c in enumerate(corpus(DEFAULT_MODEL))]  # fmt: skip
        results = await run_corpus("127.0.0.1", gw.port, cases)
        # Every policy routed requests (the corpus is not all refused before routing).
        routed = {t.name: t for t in gw.tenants.tenants.values()}
        assert set(routed) == set(policies)
        assert sum(r.m_requests.value for r in gw.replicas) > 500
    finally:
        await gw.stop()
        for r in replicas:
            r.stop()
    table = summarize(results)
    bad = [f"{r.case.klass} {r.case.name}: {r.problems} {r.statuses} {r.detail}"
           for r in results if r.problems]  # fmt: skip
    assert not bad, (table, bad[:20])
    assert sum(row["cases"] for row in table.values()) == len(cases)
