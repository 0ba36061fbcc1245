"""A counted answer's blocks filled in decode runs are registered lazily
(`KVCacheManager.lazy_answers`): whatever could see them must find them as if they had been
registered at once, and the pool must end as eager registration leaves it."""

from __future__ import annotations

from gpufleet.engine.kv_cache_manager import KVCacheManager
from gpufleet.engine.request import CountedOutputRequest

BS = 4


def _admit(kv: KVCacheManager, req: CountedOutputRequest) -> int:
    """Admit `req` with its cached prefix and compute it all (as one prefill); the number of
    blocks it found cached."""
    hits = kv.get_computed_blocks(req)
    computed = len(hits) * BS
    assert kv.allocate_slots(req, req.num_tokens - computed, hits)
    req.num_computed_tokens = req.num_tokens
    return len(hits)


def _decode(kv: KVCacheManager, reqs: list[CountedOutputRequest], steps: int) -> None:
    """`steps` decode steps of `reqs` as one jumped run, then as many stepped ones."""
    computed = [r.num_computed_tokens for r in reqs]
    for r in reqs:
        r.num_output_tokens += steps
    assert kv.allocate_decode_run(reqs, computed, steps)
    for r in reqs:
        r.num_computed_tokens += steps
    for _ in range(steps):
        for r in reqs:
            r.num_output_tokens += 1
            assert kv.allocate_slots(r, 1)
            r.num_computed_tokens += 1


def _request(rid: str, prompt: list[int], seed: int, **kw: object) -> CountedOutputRequest:
    return CountedOutputRequest(rid, prompt, 100, seed=seed, **kw)  # type: ignore[arg-type]


def _two_managers() -> tuple[KVCacheManager, KVCacheManager]:
    lazy, eager = KVCacheManager(64, BS), KVCacheManager(64, BS)
    eager.lazy_answers = False
    return lazy, eager


def test_a_preempted_request_finds_its_answer_blocks_again() -> None:
    for kv in _two_managers():
        req = _request("a", list(range(10, 19)), seed=7)
        assert _admit(kv, req) == 0
        _decode(kv, [req], 9)  # 9 + 18 tokens: blocks 2..5 hold answer tokens
        assert (req.request_id in kv._lazy) is kv.lazy_answers
        kv.free(req)  # (preempted: recomputed from its cache)
        assert not kv._lazy
        req.num_computed_tokens = 0
        assert _admit(kv, req) == (req.num_tokens - 1) // BS == 6


def test_a_lookup_meeting_a_running_answer_finds_it() -> None:
    """A chain equal to a running request's (as a collision would make it) must hit the
    answer blocks that request filled, as it would had they been registered at once."""
    found = []
    for kv in _two_managers():
        a = _request("a", list(range(10, 19)), seed=7)
        _admit(kv, a)
        _decode(kv, [a], 9)
        assert ("a" in kv._lazy) is kv.lazy_answers
        twin = _request("b", list(range(10, 19)), seed=1, prompt_block_hashes=a.block_hashes)
        twin.num_output_tokens = 18  # (as long as `a`: its chain is a's)
        found.append(len(kv.get_computed_blocks(twin)))
        assert not kv._lazy  # (the lookup registered a's answer blocks first)
    assert found == [6, 6]


def test_another_registration_of_a_reserved_hash_comes_after() -> None:
    """A request registering hashes a lazy answer holds (a collision) finds them cached
    there, as the eager order has it (first writer wins)."""
    prints = []
    for kv in _two_managers():
        a = _request("a", list(range(10, 19)), seed=7)
        _admit(kv, a)
        _decode(kv, [a], 5)
        assert ("a" in kv._lazy) is kv.lazy_answers
        b = _request("b", [1] * 9, seed=2, prompt_block_hashes=[-1, -2])
        _admit(kv, b)
        b.block_hashes += a.block_hashes[2:4]  # (its next blocks hash as a's: a collision)
        for _ in range(8):
            b.num_output_tokens += 1
            assert kv.allocate_slots(b, 1)
            b.num_computed_tokens += 1
        prints.append(kv.fingerprint())
        kv.free(a)
        kv.free(b)
        prints.append(kv.pool.fingerprint())
    assert prints[:2] == prints[2:]


def test_the_pool_ends_as_eager_registration_leaves_it() -> None:
    prints = []
    for kv in _two_managers():
        reqs = [_request(f"r{i}", [5 + i] * (6 + 3 * i), seed=i) for i in range(4)]
        for r in reqs[:3]:
            _admit(kv, r)
        _decode(kv, reqs[:3], 6)
        _admit(kv, reqs[3])
        _decode(kv, reqs, 7)
        prints.append(kv.fingerprint())
        for r in (reqs[1], reqs[0]):
            kv.free(r)
        _decode(kv, [reqs[2], reqs[3]], 5)
        prints.append(kv.fingerprint())
        for r in (reqs[3], reqs[2]):
            kv.free(r)
        prints.append(kv.pool.fingerprint())
    assert prints[:3] == prints[3:]


def test_extend_chain_adds_what_extend_range_adds() -> None:
    """`extend_chain` (a counted answer's blocks base+len..base+stop-1) leaves a HashChain
    and a list as `extend(range(...))` would: the same hashes, the HashChain's runs merged
    where the answer runs on."""
    from gpufleet.engine.block_runs import extend_chain
    from gpufleet.hash_runs import HashChain

    base = (1 << 63) - 50  # (beyond a compiled int's native range, as real hashes are)
    for prompt in ([(7, 3)], [(7, 3), (base + 3, 2)]):
        chain, expected = HashChain(prompt), HashChain(prompt)
        extend_chain(chain, base, 9)
        expected.extend(range(base + len(expected), base + 9))
        assert list(chain) == list(expected) and chain.runs == expected.runs
        assert len(chain) == 9
        as_list = list(HashChain(prompt))
        extend_chain(as_list, base, 9)
        assert as_list == list(expected)
    # nothing to add: unchanged
    chain = HashChain([(7, 3)])
    extend_chain(chain, base, 3)
    assert chain.runs == [(7, 3)] and len(chain) == 3
