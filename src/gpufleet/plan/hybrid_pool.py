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
copy of the state, vLLM's `mamba_cache_mode='align'`: `state_blocks_per_request`) in each
state group.

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
# How many blocks a request keeps in each state group (MambaSpec.max_memory_usage_bytes):
# one with prefix caching off (mamba_cache_mode 'none'), two with it on in 'align' mode
# (the running state and the last block-aligned copy). 'align' arrived with
# vllm-project/vllm#30877 (merged 2026-01-23; `MambaCacheMode` is in the 0.16.0 API, absent
# before 0.15), so earlier releases serve a hybrid with one block whatever the flag.
ALIGN_MODE_SINCE = (0, 15)
# Hybrids kept prefix caching opt-in (vllm-project/vllm#23716, 0.10.2: "disabling prefix
# caching") until vllm-project/vllm#50991 turned it on by default in 'align' mode: 0.27.1
# still starts Qwen3.5 without it, 0.28.0 logs enable_prefix_caching=True with no flag.
PREFIX_CACHING_DEFAULT_SINCE = (0, 28)


def state_blocks_per_request(
    engine_version: tuple[int, ...], prefix_caching: bool | None = None
) -> int:
    """Blocks a request holds in each state group of vLLM `engine_version`;
    `prefix_caching` None: vLLM's default for hybrids at that version. Mamba-2 models that
    declare 'all' mode (Nemotron-H) take one block per attention block instead when prefix
    caching is on before 0.28; that mode is not modelled."""
    if prefix_caching is None:
        prefix_caching = engine_version >= PREFIX_CACHING_DEFAULT_SINCE
    return 2 if prefix_caching and engine_version >= ALIGN_MODE_SINCE else 1


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
    prefix_caching: bool | None = None,
) -> HybridPool:
    """The pool of one GPU holding `attention_layers` layers of `attention_bytes_per_token`
    bytes per token each and `state_layers` layers of `state_bytes` each, in `kv_bytes`;
    `prefix_caching` as vLLM runs (None: its default at `engine_version`)."""
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
    state_blocks = state_blocks_per_request(engine_version, prefix_caching)
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
