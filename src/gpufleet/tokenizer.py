"""A small deterministic tokenizer that ships with the package (nothing is downloaded).

One token is one whitespace-separated word. Known words map to their vocabulary id;
any other word maps to a stable hash of itself inside the vocabulary, so equal texts
always give equal ids (and so equal prefix-block hashes) in every process.

Generated text is made of vocabulary words, each emitted with a leading space, so the
concatenated output re-tokenizes to exactly as many tokens as were generated. The same
rule is expressible as a Hugging Face `WordLevel` tokenizer with a `WhitespaceSplit`
pre-tokenizer (see `to_hf_tokenizer_json`), which is what external clients such as
aiperf load to count tokens the way the simulated replica does.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

VOCAB_SIZE = 32000
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
SPECIAL_TOKENS = (
    "<|unk|>",
    "<|bos|>",
    "<|eos|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)


def _build_vocab(size: int) -> list[str]:
    """Special tokens, then pronounceable words of 1, 2 and 3 syllables (deterministic)."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70
    words: list[str] = list(SPECIAL_TOKENS)
    for a in syllables:
        words.append(a)
    for a in syllables:
        for b in syllables:
            words.append(a + b)
    for a in syllables:
        for b in syllables:
            for c in syllables:
                if len(words) >= size:
                    return words[:size]
                words.append(a + b + c)
    return words[:size]


class Tokenizer:
    """Whitespace-word tokenizer with a fixed generated vocabulary."""

    def __init__(self, vocab_size: int = VOCAB_SIZE):
        self.vocab: list[str] = _build_vocab(vocab_size)
        self.vocab_size = len(self.vocab)
        self._ids: dict[str, int] = {w: i for i, w in enumerate(self.vocab)}
        self.eos_token_id = self._ids["<|eos|>"]
        self.bos_token_id = self._ids["<|bos|>"]
        # Ordinary words (no special tokens) used for generated text and synthetic prompts.
        self.first_word_id = len(SPECIAL_TOKENS)

    def token_id(self, word: str) -> int:
        tid = self._ids.get(word)
        if tid is None:
            # Out-of-vocabulary words land on a stable id among the ordinary words.
            span = self.vocab_size - self.first_word_id
            tid = self.first_word_id + zlib.crc32(word.encode()) % span
        return tid

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        out: list[int] = []
        for word in text.split():
            tid = ids.get(word)
            out.append(tid if tid is not None else self.token_id(word))
        return out

    def count(self, text: str) -> int:
        return len(text.split())

    def token_text(self, token_id: int) -> str:
        """The text of one generated token, with its leading space."""
        return " " + self.vocab[token_id]

    def decode(self, ids: Iterable[int]) -> str:
        vocab = self.vocab
        return "".join(" " + vocab[i] for i in ids)

    def word_ids_for_seed(self, seed: int, n: int) -> list[int]:
        """n ordinary-word ids from a deterministic linear congruential sequence."""
        span = self.vocab_size - self.first_word_id
        out = []
        x = (seed * 2654435761 + 12345) & 0xFFFFFFFF
        for _ in range(n):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            out.append(self.first_word_id + x % span)
        return out

    def to_hf_tokenizer_json(self) -> dict[str, Any]:
        """This tokenizer as a Hugging Face `tokenizer.json` (WordLevel + WhitespaceSplit).

        Counts agree with `count` for any text; ids agree for in-vocabulary words.
        """
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": None,
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
            "model": {"type": "WordLevel", "vocab": dict(self._ids), "unk_token": "<|unk|>"},
        }

    def save_hf_directory(self, directory: str) -> None:
        """Write a directory that `transformers.AutoTokenizer.from_pretrained` can load."""
        import os

        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "tokenizer.json"), "w") as f:
            json.dump(self.to_hf_tokenizer_json(), f)
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "unk_token": "<|unk|>",
                    "bos_token": "<|bos|>",
                    "eos_token": "<|eos|>",
                    "model_max_length": 1_000_000,
                    "chat_template": CHAT_TEMPLATE_JINJA,
                },
                f,
            )
        with open(os.path.join(directory, "special_tokens_map.json"), "w") as f:
            json.dump({"unk_token": "<|unk|>", "bos_token": "<|bos|>", "eos_token": "<|eos|>"}, f)


@lru_cache(maxsize=1)
def default_tokenizer() -> Tokenizer:
    return Tokenizer()


# The fixed chat template: every marker is its own whitespace-separated token.
CHAT_TEMPLATE_JINJA = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _content_text(content: Any) -> str:
    """OpenAI message content: a string, or a list of parts whose text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
        return " ".join(texts)
    raise TypeError("message content must be a string or a list of content parts")


def apply_chat_template(
    messages: Sequence[dict[str, Any]],
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
) -> str:
    """Render chat messages to the prompt text the replica tokenizes (CHAT_TEMPLATE_JINJA).

    With `continue_final_message` the last message stays open (no `<|end|>`), so the model
    goes on with it, as vLLM renders it for a prefilled answer.
    """
    parts = []
    for m in messages:
        parts.append(f"<|{m.get('role', 'user')}|> {_content_text(m.get('content'))} <|end|> ")
    if continue_final_message and parts:
        parts[-1] = parts[-1].removesuffix("<|end|> ")
    if add_generation_prompt:
        parts.append("<|assistant|>")
    return "".join(parts)


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks of `token_ids` (a partial last block is not hashed).

    Block i's hash covers every token up to the end of block i, so equal hashes mean equal
    prefixes. Python hashes tuples of ints identically in every process.
    """
    out: list[int] = []
    h = parent
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hash((h, *token_ids[start : start + block_size]))
        out.append(h)
    return out
