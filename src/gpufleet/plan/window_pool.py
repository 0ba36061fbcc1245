"""vLLM's KV pool for sliding-window models (Gemma 2/3/4, gpt-oss, MiMo, Mistral with
`sliding_window`), and the two lines vLLM logs from it, by version.

vLLM's hybrid KV cache manager (vllm/v1/core/kv_cache_utils.py) keys layers by their KV
spec (full, or sliding with its window; each shape its own kind). Pages are made one size
by scaling a smaller page's block (`unify_kv_cache_spec_page_size`: a kind of half the
bytes per token gets a 32-token block). Kinds are split into groups of `group_size`
layers: the smallest kind's count, or the largest one's when it is under 1.5 × the
smallest (`_get_kv_cache_groups_uniform_page_size`); a short group is padded. The pool is
`group_size` tensors of `num_blocks` pages (`get_num_blocks`: bytes // page // group_size).
A request of max_model_len tokens takes cdiv(len, block) blocks in a full group and
cdiv(min(window − 1 + in-flight tokens, len), block) + 1 in a sliding group
(`SlidingWindowSpec.max_memory_usage_bytes`) and cdiv(min(chunk + in-flight tokens, len),
block) in a chunked-local one (Llama 4; `ChunkedLocalAttentionSpec`: its chunks start on a
block boundary, so no extra block), and "Maximum concurrency" is num_blocks over their sum (`get_max_concurrency_for_kv_cache_config`). Layers all of one window
(or all full with different shapes) make one group (`UniformTypeKVCacheSpecs`).

"GPU KV cache size: N tokens" (`_report_kv_cache_config`) was num_blocks // groups ×
the smallest block — every layer charged as full attention, padding layers included —
and became int(max_concurrency × max_model_len) (vllm-project/vllm#40694's formula; its
code comment: SWA groups' per-request blocks are capped by their window, so the old
formula underestimates). Release 0.20.0 still logs the old way and 0.21.0 the new:
vllm-project/vllm#43308 (Gemma-4-31B AWQ, A100, the same ~50 GB of KV) logs ~55k tokens
on 0.20.0 and ~525k on 0.21.0, the tenfold that only the new formula gives for a model of
50 sliding (1024) and 10 full layers.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

ALIGN_TOKENS = 16  # vLLM's default block
# group by the largest kind's count when under 1.5 × the smallest's: one rule for sliding
# and hybrid pools (one function in vLLM; 1.5 in its current source, 1.25 in an older copy)
GROUP_BALANCE = 1.5
LOG_BY_CONCURRENCY_SINCE = (0, 21)  # "GPU KV cache size" = max_concurrency × max_model_len
# The in-flight tokens a windowed group reserves for: one max_num_batched_tokens batch, and
# from vllm-project/vllm#47728 (0.26; vllm-project/vllm#49878 quotes 4161 blocks =
# cdiv(1023 + 2 × 32,768, 16) + 1) `VllmConfig.max_in_flight_tokens`, one batch per
# concurrent step: 2 under async scheduling (the default) at PP 1, PP batches beyond (the
# V1 runner turns async off with PP). Still so in 0.27.1's source.
IN_FLIGHT_BATCHES_SINCE = (0, 26)


def in_flight_batches(engine_version: tuple[int, ...], pp: int = 1) -> int:
    """Batches of max_num_batched_tokens a windowed KV group reserves for."""
    return max(2, pp) if engine_version >= IN_FLIGHT_BATCHES_SINCE else 1


@dataclass(frozen=True)
class WindowPool:
    page_bytes: float  # one layer's page (the largest kind's 16 tokens; mean if one group)
    group_size: int
    groups: int
    min_block_tokens: int
    num_blocks: int
    blocks_per_request: int  # for a request of max_model_len tokens
    concurrency: float  # "Maximum concurrency for max_model_len tokens per request"
    logged_tokens: int  # "GPU KV cache size: N tokens"


def logs_concurrency_times_length(engine_version: tuple[int, ...]) -> bool:
    """Whether vLLM `engine_version` logs its KV tokens as max_concurrency × max_model_len."""
    return engine_version >= LOG_BY_CONCURRENCY_SINCE


def window_pool(
    layers: list[tuple[int | None, float]],
    kv_bytes: float,
    max_model_len: int,
    max_num_batched_tokens: int,
    engine_version: tuple[int, ...] = (1,),
    *,
    chunked: bool = False,
    pp: int = 1,
) -> WindowPool | None:
    """vLLM's pool of one GPU whose attention layers are `layers`, each (sliding window or
    None for full attention, KV bytes per token), holding `kv_bytes`; None when no layer
    slides or the pages cannot be unified (a page not a whole multiple of another).
    chunked: the windows are Llama 4's attention chunks, not sliding windows (vLLM serves
    no model with both)."""
    kinds = Counter(layers)
    if not kinds or all(window is None for window, _ in kinds) or min(b for _, b in kinds) <= 0:
        return None

    in_flight = in_flight_batches(engine_version, pp) * max_num_batched_tokens

    def per_request(window: int | None, block: int) -> int:
        if window is None:
            return -(-max_model_len // block)
        if chunked:
            return -(-min(window + in_flight, max_model_len) // block)
        held = min(window - 1 + in_flight, max_model_len)
        return -(-held // block) + 1

    if len({window for window, _ in kinds}) == 1:
        # One window for every layer: one group of 16-token blocks, each layer its own page.
        window = next(iter(kinds))[0]
        group_size, groups, min_block = len(layers), 1, ALIGN_TOKENS
        page = ALIGN_TOKENS * sum(b for _, b in layers) / len(layers)
        num_blocks = max(0, math.floor(kv_bytes / (page * len(layers))))
        request = per_request(window, ALIGN_TOKENS)
    else:
        largest = max(b for _, b in kinds)
        blocks: dict[tuple[int | None, float], int] = {}
        for kind in kinds:
            ratio = largest / kind[1]
            if abs(ratio - round(ratio)) > 1e-9:
                return None
            blocks[kind] = ALIGN_TOKENS * round(ratio)
        page = ALIGN_TOKENS * largest
        small, large = min(kinds.values()), max(kinds.values())
        group_size = large if large < small * GROUP_BALANCE else small
        count = {k: -(-n // group_size) for k, n in kinds.items()}
        groups = sum(count.values())
        min_block = min(blocks.values())
        num_blocks = max(0, math.floor(kv_bytes / (page * group_size)))
        request = sum(n * per_request(k[0], blocks[k]) for k, n in count.items())
    concurrency = num_blocks / request
    if logs_concurrency_times_length(engine_version):
        logged = int(concurrency * max_model_len)
    else:
        logged = num_blocks // groups * min_block
    return WindowPool(
        page_bytes=page,
        group_size=group_size,
        groups=groups,
        min_block_tokens=min_block,
        num_blocks=num_blocks,
        blocks_per_request=request,
        concurrency=concurrency,
        logged_tokens=logged,
    )
