"""Prompt text of an exact token count, from the shared word tokenizer.

One token is one whitespace word (`gpufleet.tokenizer`), so joining N vocabulary words
gives a prompt the replica counts as N tokens. Texts are deterministic in their seed, so
equal seeds give equal text and hence equal prefix-cache blocks.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

from gpufleet.tokenizer import Tokenizer, default_tokenizer


def mix_seed(*parts: int | str) -> int:
    """A 32-bit seed from several parts, so different purposes never share a word stream."""
    return zlib.crc32(":".join(str(p) for p in parts).encode())


class PromptFactory:
    """Builds prompt texts: unique random text, and fixed blocks addressed by an id."""

    def __init__(
        self, tokenizer: Tokenizer | None = None, block_tokens: int = 512, cache_blocks: int = 4096
    ):
        if block_tokens < 1:
            raise ValueError("block_tokens must be at least 1")
        self.tokenizer = tokenizer or default_tokenizer()
        self.block_tokens = block_tokens
        self._block_cache: OrderedDict[int, list[str]] = OrderedDict()
        self._cache_blocks = cache_blocks

    def words(self, seed: int, n_tokens: int) -> list[str]:
        vocab = self.tokenizer.vocab
        return [vocab[i] for i in self.tokenizer.word_ids_for_seed(seed, n_tokens)]

    def text(self, seed: int, n_tokens: int) -> str:
        """Text of exactly `n_tokens` words, determined by `seed`."""
        if n_tokens <= 0:
            return ""
        return " ".join(self.words(seed, n_tokens))

    def block_words(self, block_id: int) -> list[str]:
        """The `block_tokens` words of block `block_id` (equal ids give equal words)."""
        cached = self._block_cache.get(block_id)
        if cached is not None:
            self._block_cache.move_to_end(block_id)
            return cached
        words = self.words(mix_seed("block", block_id), self.block_tokens)
        self._block_cache[block_id] = words
        if len(self._block_cache) > self._cache_blocks:
            self._block_cache.popitem(last=False)
        return words

    def text_from_blocks(self, block_ids: list[int], n_tokens: int, fill_seed: int) -> str:
        """Text of exactly `n_tokens` words: the blocks in order, cut at `n_tokens`.

        If the blocks hold fewer words than asked, unique words seeded by `fill_seed`
        fill the rest, so the count is always exact.
        """
        words: list[str] = []
        for block_id in block_ids:
            if len(words) >= n_tokens:
                break
            words.extend(self.block_words(block_id))
        del words[n_tokens:]
        if len(words) < n_tokens:
            words.extend(self.words(fill_seed, n_tokens - len(words)))
        return " ".join(words)
