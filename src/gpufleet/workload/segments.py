"""Prompts as named segments, and their block hashes, without building any text.

A prompt's shape is a sequence of segments `(key, tokens)`: a Mooncake 512-token block,
a shared-prefix group's prefix, a request's own suffix. Two prompts share their first L
tokens exactly when their segments agree up to L, which is all a prefix cache (engine,
16-token blocks) and a prefix router (routing blocks) can see. Live traffic renders a
segment as words (`PromptFactory.segments_text`: the first n words of the key's own word
stream); the simulator never builds text: its hashes are chained over the segment pieces
a block covers, not over token ids, so equal prefixes give equal hashes as real tokens
would, at a fraction of the cost (an hour of Mooncake is 144M prompt tokens; building and
hashing their words would take minutes).

Keys are ints, and hashes are Python hashes of int tuples, so they are the same in every
process (no string hashing, which is salted per process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from gpufleet.hash_runs import RunList, Runs, append_run

# Segment kinds, packed into the key's high bits so keys of different kinds never collide.
KIND_TRACE_BLOCK = 1  # a trace's named block (Mooncake hash_ids)
KIND_UNIQUE = 2  # a request's own text (suffix, random prompt, Azure prompt)
KIND_PREFIX = 3  # a shared-prefix group's prefix
KIND_ANSWER = 4  # an earlier answer, resent in a multi-turn session
_KIND_SHIFT = 48
_TRACE_KEYS_FROM = KIND_TRACE_BLOCK << _KIND_SHIFT  # (the keys of that kind)
_TRACE_KEYS_TO = (KIND_TRACE_BLOCK + 1) << _KIND_SHIFT
_FIRST_NUMBERED = 1 << 61  # numbered blocks: far from small ints (tests' hashes)

Segments = tuple[tuple[int, int], ...]  # (key, tokens)


def segment_key(kind: int, ident: int) -> int:
    return (kind << _KIND_SHIFT) | (ident & ((1 << _KIND_SHIFT) - 1))


def segment_kind(key: int) -> int:
    return key >> _KIND_SHIFT


def named_key(kind: int, *parts: int | str) -> int:
    """The key of a segment named by several parts (e.g. 'suffix', seed, request index):
    48 bits of a stable digest, so distinct names practically never share a key."""
    return key_of_name(kind, ":".join(map(str, parts)))


def key_of_name(kind: int, name: str) -> int:
    """`named_key` of the parts that `name` joins with ':' (a caller making many keys
    of one pattern formats them itself)."""
    digest = hashlib.blake2b(name.encode(), digest_size=6).digest()
    return (kind << _KIND_SHIFT) | int.from_bytes(digest, "big")


class SegmentHasher:
    """Chained hashes of the full `block_tokens` blocks of a segmented prompt.

    Block i's hash covers everything up to the end of block i (like
    `gpufleet.tokenizer.block_hashes`). The whole blocks of a segment that starts on a
    block boundary depend only on (parent hash, segment key, block index): they are
    consecutive ints from one hash of (parent, key), made at C speed (a Mooncake prompt
    is ~750 engine blocks); a block that mixes segments hashes its pieces.

    A trace's blocks are short segments (Mooncake's: 512 tokens, 32 engine blocks) that
    prompts share in ever new orders; their blocks are numbered from a counter instead,
    the first time a (parent, key) is seen, so the blocks of a prompt's new segments are
    one run of consecutive ints too, and a prefix cache that works on runs
    (`gpufleet.engine.block_pool`) sees a prompt as a few runs, not one per segment. Equal
    prefixes still give equal hashes (in this hasher: the numbering is its own).
    """

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self.block_tokens = block_tokens
        # (parent, key) -> (first, count): kept as key -> (parent, first, count) for the
        # first parent a key is seen after (a trace's block nearly always follows the
        # same blocks: an int key, no tuple to build and hash), by both for the others.
        self._by_key: dict[int, tuple[int, int, int]] = {}
        self._numbered: dict[tuple[int, int], tuple[int, int]] = {}
        self._next_id = _FIRST_NUMBERED

    def hashes(self, segments: Segments) -> list[int]:
        return self.chain(segments)

    def chain(self, segments: Segments) -> RunList:
        """The hashes, a list that knows its runs of consecutive ints (`runs`)."""
        runs = self.runs(segments)
        out = RunList()
        for first, count in runs:
            out += range(first, first + count)
        out.runs = runs
        return out

    def runs(self, segments: Segments) -> Runs:
        """The hashes as (first, count) runs of consecutive ints."""
        bs = self.block_tokens
        runs: Runs = []
        parent = 0
        pieces: list[int] = []  # (key, offset, count) triples of the open block, flattened
        open_tokens = 0
        by_key = self._by_key
        next_id = self._next_id
        run_first = run_stop = 0  # the numbered run being built (not in `runs` yet)
        trace_from, trace_to, known_as = _TRACE_KEYS_FROM, _TRACE_KEYS_TO, by_key.get
        for key, n in segments:
            offset = 0
            if open_tokens == 0 and n >= bs:
                # Aligned start: block b of this segment is base + b (a truncated copy of
                # the segment shares its head, as equal tokens would).
                full = n // bs
                offset = full * bs
                if trace_from <= key < trace_to:  # (a trace block)
                    known = known_as(key)
                    if known is None:  # first seen: the next `full` ints
                        first = next_id
                        count = full
                        by_key[key] = (parent, next_id, full)
                        next_id += full
                    elif known[0] == parent:
                        _, first, count = known
                    else:
                        first, count, next_id = self._other_parent(parent, key, full, next_id)
                    if count >= full:
                        if first != run_stop:
                            if run_stop:
                                append_run(runs, run_first, run_stop - run_first)
                            run_first = first
                        run_stop = first + full
                        parent = run_stop - 1
                        if offset == n:
                            continue
                    else:  # longer than when first seen: the rest by hash, as before
                        if run_stop:
                            append_run(runs, run_first, run_stop - run_first)
                            run_first = run_stop = 0
                        append_run(runs, first, count)
                        base = hash((parent, key, bs))
                        append_run(runs, base + count, full - count)
                        parent = base + full - 1
                else:
                    if run_stop:
                        append_run(runs, run_first, run_stop - run_first)
                        run_first = run_stop = 0
                    base = hash((parent, key, bs))
                    append_run(runs, base, full)
                    parent = base + full - 1
            if run_stop:
                append_run(runs, run_first, run_stop - run_first)
                run_first = run_stop = 0
            while offset < n:
                take = min(n - offset, bs - open_tokens)
                pieces.extend((key, offset, take))
                open_tokens += take
                offset += take
                if open_tokens == bs:
                    parent = hash((parent, *pieces))
                    append_run(runs, parent, 1)
                    pieces.clear()
                    open_tokens = 0
        if run_stop:
            append_run(runs, run_first, run_stop - run_first)
        self._next_id = next_id
        return runs

    def _other_parent(self, parent: int, key: int, full: int, next_id: int) -> tuple[int, int, int]:
        """(first, count, next id) of a trace block seen after another parent before."""
        seen = self._numbered.get((parent, key))
        if seen is None:
            self._numbered[parent, key] = (next_id, full)
            return next_id, full, next_id + full
        return seen[0], seen[1], next_id


def placeholder_token_ids(n_tokens: int) -> list[int]:
    """Token ids for the engine when block hashes are given: only the count matters (the
    engine hashes generated tokens onto the prompt's last full-block hash, which is unique
    to the prefix)."""
    return [0] * n_tokens


def common_prefix_tokens(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """How many leading tokens two segmented prompts share (for tests and reports)."""
    shared = 0
    for (ka, na), (kb, nb) in zip(a, b, strict=False):
        if ka != kb:
            break
        shared += min(na, nb)
        if na != nb:
            break
    return shared
