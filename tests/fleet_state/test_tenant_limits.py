"""A tenant's limits (the gateway's 429s, and the simulator's): a token bucket and a cap."""

from __future__ import annotations

import pytest

from gpufleet.fleet_state import TenantLimits, TokenBucket


def test_token_bucket_starts_full_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=2)
    assert bucket.take(100.0) == 0.0 and bucket.take(100.0) == 0.0  # the burst
    assert bucket.take(100.0) == pytest.approx(0.5)  # one token in 0.5 s
    assert bucket.take(100.5) == 0.0
    assert bucket.take(110.0) == 0.0 and bucket.take(110.0) == 0.0
    assert bucket.take(110.0) > 0  # refilled to the burst, no more


def test_limits_cap_concurrency_and_rate_with_retry_after() -> None:
    limits = TenantLimits(max_concurrency=2, bucket=TenantLimits.bucket_for(1.0, 3))
    assert [limits.admit(0.0) for _ in range(3)] == [0, 0, 1]  # the cap: Retry-After 1
    assert limits.in_flight == 2
    limits.release()
    assert limits.admit(0.0) == 0  # the bucket's third token
    limits.release()
    limits.release()
    assert limits.admit(0.0) == 1  # bucket empty: one token a second
    assert limits.admit(1.0) == 0 and limits.in_flight == 1


def test_bucket_for_follows_the_gateway_config() -> None:
    assert TenantLimits.bucket_for(None, 5) is None
    bucket = TenantLimits.bucket_for(0.5, None)
    assert bucket is not None and bucket.burst == 1.0  # burst defaults to max(1, rate)
    bucket = TenantLimits.bucket_for(8.0, None)
    assert bucket is not None and bucket.burst == 8.0
