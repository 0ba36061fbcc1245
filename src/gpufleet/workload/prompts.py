"""Prompt text of an exact token count, rendered from a prompt's segments.

One token is one whitespace word (`gpufleet.tokenizer`), so joining N vocabulary words
gives a prompt the replica counts as N tokens. A segment `(key, n)` renders as the first
n words of the key's own deterministic word stream, so equal keys give equal words (a
shared prefix, a Mooncake block cut anywhere) and hence equal prefix-cache blocks.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Iterable

from gpufleet.tokenizer import Tokenizer, default_tokenizer
from gpufleet.workload.segments import KIND_UNIQUE, segment_kind


def mix_seed(*parts: int | str) -> int:
    """A 32-bit seed from several parts, so different purposes never share a word stream."""
    return zlib.crc32(":".join(str(p) for p in parts).encode())


class PromptFactory:
    """Renders segments as words; remembers the words of shared segments (LRU)."""

    def __init__(self, tokenizer: Tokenizer | None = None, cache_segments: int = 4096):
        self.tokenizer = tokenizer or default_tokenizer()
        self._cache: OrderedDict[int, list[str]] = OrderedDict()
        self._cache_segments = cache_segments

    def words(self, seed: int, n_tokens: int) -> list[str]:
        """`n_tokens` vocabulary words of the stream `seed` (a prefix of any longer draw)."""
        vocab = self.tokenizer.vocab
        return [vocab[i] for i in self.tokenizer.word_ids_for_seed(seed, n_tokens)]

    def segment_words(self, key: int, n_tokens: int) -> list[str]:
        """The first `n_tokens` words of segment `key`."""
        if segment_kind(key) == KIND_UNIQUE:  # seen once: not worth a cache slot
            return self.words(mix_seed("segment", key), n_tokens)
        cached = self._cache.get(key)
        if cached is not None and len(cached) >= n_tokens:
            self._cache.move_to_end(key)
            return cached[:n_tokens]
        words = self.words(mix_seed("segment", key), n_tokens)
        self._cache[key] = words
        self._cache.move_to_end(key)
        if len(self._cache) > self._cache_segments:
            self._cache.popitem(last=False)
        return words

    def segments_text(self, segments: Iterable[tuple[int, int]]) -> str:
        """The text of a segmented prompt: exactly as many words as its tokens."""
        words: list[str] = []
        for key, n in segments:
            words.extend(self.segment_words(key, n))
        return " ".join(words)
