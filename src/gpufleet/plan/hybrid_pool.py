"""vLLM's KV pool for hybrid models: attention layers beside layers that hold a fixed state
per sequence (Mamba-2, Gated DeltaNet).

vLLM's hybrid KV cache manager gives every layer's page one size. It raises the attention
block until one attention page (block × K+V bytes per token of one layer) holds a layer's
state (conv window + SSM state), in multiples of 16 tokens ("Setting attention block size
to N tokens"), and pads the state's page to that size ("Padding mamba page size by x%").
Layers of one kind are then split into groups of `group_size` layers (the smaller kind's
count, or the larger one's when the two are within 25 %; a short group is padded with
empty layers), and the pool is `group_size` tensors of `num_blocks` pages, each page shared
by one layer of every group. A request of max_model_len tokens takes cdiv(len, block)
blocks in each attention group and one block (two once prefix caching keeps an aligned
copy of the state, vLLM's `mamba_cache_mode='align'`) in each state group.

The log line "GPU KV cache size: N tokens" was num_blocks // groups × block up to vLLM
0.20 (vllm-project/vllm#40691: Qwen3.5-27B on 0.19, 290,864 tokens beside 33.04x
concurrency at 32k) and is max_concurrency × max_model_len from 0.21 (the one report
function serves sliding-window models too: `plan.window_pool` gives the evidence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.plan.window_pool import GROUP_BALANCE, logs_concurrency_times_length

ALIGN_TOKENS = 16  # the attention block is a multiple of the kernels' 16-token block
# vLLM 0.19 serves hybrids without prefix caching; 0.24 (noonghunna/club-3090#612, prefix
# caching on), 0.26 and 0.28 cache prefixes ('align': two state blocks per request).
# 0.20-0.23 were not seen; 0.20 is where it turns here. The token log turns at 0.21
# (window_pool.LOG_BY_CONCURRENCY_SINCE, from vLLM's releases).
PREFIX_CACHED_STATE_SINCE = (0, 20)


@dataclass(frozen=True)
class HybridPool:
    block_tokens: int  # the attention block vLLM sets so that a page holds one state
    page_bytes: float  # one layer's page (the state's page padded to it)
    group_size: int
    attention_groups: int
    state_groups: int
    num_blocks: int
    blocks_per_request: int  # for a request of max_model_len tokens
    concurrency: float  # requests of max_model_len the pool holds
    logged_tokens: int  # as vLLM logs "GPU KV cache size: N tokens"

    @property
    def bytes_per_request(self) -> float:
        return self.blocks_per_request * self.page_bytes * self.group_size


def hybrid_pool(
    attention_layers: int,
    state_layers: int,
    attention_bytes_per_token: float,
    state_bytes: float,
    kv_bytes: float,
    max_model_len: int,
    engine_version: tuple[int, ...] = (1,),
) -> HybridPool:
    """The pool of one GPU holding `attention_layers` layers of `attention_bytes_per_token`
    bytes per token each and `state_layers` layers of `state_bytes` each, in `kv_bytes`."""
    if attention_layers < 1 or state_layers < 1 or attention_bytes_per_token <= 0:
        raise ValueError("a hybrid pool needs attention and state layers")
    per_align = ALIGN_TOKENS * attention_bytes_per_token
    block = ALIGN_TOKENS * max(1, math.ceil(state_bytes / per_align))
    page = block * attention_bytes_per_token
    small, large = sorted((attention_layers, state_layers))
    group = large if large < small * GROUP_BALANCE else small
    attention_groups = -(-attention_layers // group)
    state_groups = -(-state_layers // group)
    num_blocks = max(0, math.floor(kv_bytes / (page * group)))
    state_blocks = 2 if engine_version >= PREFIX_CACHED_STATE_SINCE else 1
    per_request = -(-max_model_len // block) * attention_groups + state_blocks * state_groups
    concurrency = num_blocks / per_request
    if logs_concurrency_times_length(engine_version):
        logged = int(concurrency * max_model_len)
    else:
        logged = num_blocks // (attention_groups + state_groups) * block
    return HybridPool(
        block_tokens=block,
        page_bytes=page,
        group_size=group,
        attention_groups=attention_groups,
        state_groups=state_groups,
        num_blocks=num_blocks,
        blocks_per_request=per_request,
        concurrency=concurrency,
        logged_tokens=logged,
    )
