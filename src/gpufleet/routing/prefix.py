"""Turn a request body into the chained prefix-block hashes a router matches on.

The gateway calls `request_prefix_hashes(body, endpoint)` before routing. It renders the
prompt as the replica does (the chat template of `gpufleet.tokenizer`) and hashes it in
fixed blocks of `ROUTING_BLOCK_BYTES` bytes of UTF-8 text, each hash covering everything
up to the end of its block (one running blake2b). Two prompts that share their first L
bytes share their first L // ROUTING_BLOCK_BYTES hashes, which is all a router needs, and
no tokenizer runs on the hot path: a 10k-token prompt hashes in a fraction of a
millisecond, the same in every gateway process (blake2b, not Python's salted `hash`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from gpufleet.tokenizer import apply_chat_template

# 256 bytes of text ≈ 64 tokens of English (~4 bytes a token): fine enough that a shared
# system prompt of a few hundred tokens matches, coarse enough that a 10k-token prompt is
# a couple of hundred hashes.
ROUTING_BLOCK_BYTES = 256
# The same block in tokens, for drivers that see token counts rather than text (the
# simulator hashes its prompts' segments in blocks of this many tokens).
ROUTING_BLOCK_TOKENS = 64
# For turning a cache size in tokens into routing blocks. English text averages ~4 bytes a
# token, the shipped tokenizer's words ~6.7. Errs high on purpose: an index that forgets a
# prefix the replica still holds sends its next request elsewhere (a miss and a duplicate),
# while one that remembers an evicted prefix only re-warms the same replica. Measured on
# the routing_quality benchmark: 0.6x the true size lost 10% of the hits, 1.2-2x lost none.
DEFAULT_BYTES_PER_TOKEN = 8.0

CHAT_ENDPOINTS = ("/v1/chat/completions", "chat/completions", "chat")
COMPLETION_ENDPOINTS = ("/v1/completions", "completions")


def prompt_text(body: dict[str, Any], endpoint: str) -> str:
    """The prompt as the replica renders it; "" when the body has none (validation and its
    4xx are the gateway's job, not the router's)."""
    if endpoint in CHAT_ENDPOINTS:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return ""
        try:
            return apply_chat_template(messages)
        except TypeError:  # malformed content; the replica will refuse it
            return ""
    if endpoint in COMPLETION_ENDPOINTS:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt:
            if not isinstance(prompt[0], int):
                prompt = prompt[0]  # a batch of prompts: route by the first
            if isinstance(prompt, list):  # token ids: hash their decimal text
                return " ".join(str(t) for t in prompt if isinstance(t, int))
        return prompt if isinstance(prompt, str) else ""
    raise ValueError(
        f"unknown endpoint {endpoint!r}; expected one of {CHAT_ENDPOINTS + COMPLETION_ENDPOINTS}"
    )


def text_prefix_hashes(text: str, block_bytes: int = ROUTING_BLOCK_BYTES) -> tuple[int, ...]:
    """Chained 64-bit hashes of the full `block_bytes` blocks of `text` (UTF-8; a lone
    surrogate, which JSON allows and UTF-8 cannot encode, is hashed as its 3 bytes)."""
    data = memoryview(text.encode("utf-8", "surrogatepass"))
    running = hashlib.blake2b(digest_size=8)
    out: list[int] = []
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        running.update(data[start : start + block_bytes])
        out.append(int.from_bytes(running.copy().digest(), "big"))
    return tuple(out)


def request_prefix_hashes(
    body: dict[str, Any], endpoint: str, block_bytes: int = ROUTING_BLOCK_BYTES
) -> tuple[int, ...]:
    """`RequestInfo.prefix_hashes` for an OpenAI request body sent to `endpoint`."""
    return text_prefix_hashes(prompt_text(body, endpoint), block_bytes)


def blocks_for_tokens(
    tokens: int,
    *,
    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN,
    block_bytes: int = ROUTING_BLOCK_BYTES,
) -> int:
    """How many routing blocks a cache of `tokens` tokens holds (at least 1)."""
    return max(1, int(tokens * bytes_per_token / block_bytes))
