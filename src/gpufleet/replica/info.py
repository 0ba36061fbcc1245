"""The replica's self-description: vLLM's /v1/models and SGLang's /get_model_info and
/get_server_info (which sglang-router asks every worker for when it registers it)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
import zlib
from typing import Any

from gpufleet.engine import EngineConfig
from gpufleet.tokenizer import Tokenizer

VLLM_API_VERSION = "0.10.2"  # the vLLM release whose API and metrics this replica mimics

_tokenizer_dirs: dict[int, str] = {}


def model_list(
    served_model_names: list[str],
    *,
    root: str,
    max_model_len: int,
    created: int,
    engine: str = "vllm",
) -> dict[str, Any]:
    """vLLM's GET /v1/models body (ModelCard with max_model_len and a permission); SGLang's
    card has no permission and says owned_by "sglang"."""
    if engine == "sglang":
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "sglang",
             "root": name, "max_model_len": max_model_len}
            for name in served_model_names
        ]}  # fmt: skip
    data = []
    for name in served_model_names:
        data.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        )
    return {"object": "list", "data": data}


def tokenizer_dir(tokenizer: Tokenizer) -> str:
    """The tokenizer as a Hugging Face directory (written once per process and content), so
    that a router which loads a worker's tokenizer reads it locally instead of a hub."""
    key = id(tokenizer)
    if key in _tokenizer_dirs:
        return _tokenizer_dirs[key]
    spec = json.dumps(tokenizer.to_hf_tokenizer_json(), sort_keys=True).encode()
    name = f"gpufleet-tokenizer-{zlib.crc32(spec):08x}"  # changes with the tokenizer
    path = os.path.join(tempfile.gettempdir(), name)
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        # written aside and renamed, so a reader never sees half a directory
        tmp = tempfile.mkdtemp(prefix="gpufleet-tokenizer-")
        tokenizer.save_hf_directory(tmp)
        try:
            os.rename(tmp, path)
        except OSError:  # another replica was first
            shutil.rmtree(tmp, ignore_errors=True)
    _tokenizer_dirs[key] = path
    return path


SGLANG_VERSION = "0.5.10"  # the SGLang release whose API and metrics the personality mimics


def sglang_model_info(model_name: str, tokenizer: Tokenizer) -> dict[str, Any]:
    # model_path is where SGLang loaded the model from: here, a local tokenizer directory.
    return {
        "model_path": tokenizer_dir(tokenizer),
        "tokenizer_path": tokenizer_dir(tokenizer),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "served_model_name": model_name,
    }


def sglang_server_info(
    model_name: str,
    tokenizer: Tokenizer,
    cfg: EngineConfig,
    *,
    tp: int,
    engine: str = "vllm",
    enable_metrics: bool = False,
    gen_throughput: float = 0.0,
) -> dict[str, Any]:
    """SGLang's GET /get_server_info: its server args, scheduler info, per-DP internal
    states and version (the vLLM personality answers it too, for sglang-router)."""
    return {
        "model_path": tokenizer_dir(tokenizer),
        "tokenizer_path": tokenizer_dir(tokenizer),
        "served_model_name": model_name,
        "tp_size": tp,
        "pp_size": cfg.pipeline_stages,
        "dp_size": 1,
        "context_length": cfg.max_model_len,
        "max_total_num_tokens": cfg.num_gpu_blocks * cfg.block_size,
        "max_req_input_len": cfg.max_model_len - 1,
        "max_running_requests": cfg.max_num_seqs,
        "chunked_prefill_size": cfg.max_num_batched_tokens,
        "page_size": cfg.block_size,
        "schedule_policy": "fcfs",
        "disable_radix_cache": not cfg.enable_prefix_caching,
        "enable_metrics": enable_metrics,
        "internal_states": [{"last_gen_throughput": gen_throughput}],
        "version": SGLANG_VERSION if engine == "sglang" else VLLM_API_VERSION,
    }
