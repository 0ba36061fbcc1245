"""MXFP4 routed experts as vLLM's MoE backends hold them, by backend, GPU and version.

vLLM picks the backend (`get_mxfp4_backend`, from 0.19 `oracle/mxfp4.py`'s
`select_mxfp4_moe_backend`) and each pads and lays out the checkpoint's uint8 values (two
fp4 a byte), its e8m0 scales (one byte per 32 values) and bf16 biases its own way:

* Blackwell (fp4 tensor cores): FlashInfer TRT-LLM, intermediate and hidden padded to 256.
* Marlin (every GPU without fp4 tensor cores when Triton is not available): intermediate
  per rank padded to 128, hidden to 256 (n % 256, k % 128 for both GEMMs); the repacked
  values and scales keep their size, the biases stay bf16.
* Triton (`triton_kernels`' matmul_ogs, Hopper): intermediate per rank padded to 64, hidden
  not padded. `_swizzle_mxfp4` converts values and scales to the Hopper layouts and the
  method keeps the swizzled scales in its `PrecisionConfig` while the layer still holds the
  loaded ones (only the value tensors are deleted), so the scales are held twice; the swizzled
  copy pads its rows to 2 × num_warps(8) × 2 × 8 = 256 (`HopperMXScaleLayout`); the biases
  become fp32. The newer `triton_kernels` also pre-pads both value dims (bytes) to 64
  (`HopperMXValueLayout.swizzle_data`, "Pre-pad both matrix dims to multiples of 64").

Triton needs `triton_kernels`, which plain vLLM installs lacked (users installed it from the
Triton repository) until vLLM shipped it: vllm-project/vllm#27370 (dependency, merged
2025-10-22) and #28788 (copied into `vllm/third_party`, merged 2025-11-15), so a Hopper run
before 0.12 took Marlin (the 0.10.1 and 0.11.0 gpt-oss-120b logs fit Marlin's weights, the
0.14.1 and 0.19.0 logs say Triton). The value pre-pad is in the copy 0.19.0 loads and not in
0.14.1's (gpt-oss-120b on an H100 loads 64.38 GiB at 0.14.1, 1.2 GiB less than the pre-pad
gives); the release between them that took the newer copy is not pinned, 0.19 is the first
whose logs show it.
"""

from __future__ import annotations

import math

from gpufleet.specs.gpus import GpuSpec

TRITON_ON_HOPPER_SINCE = (0, 12)
VALUE_PREPAD_SINCE = (0, 19)
MX_BLOCK = 32  # values per e8m0 scale
SCALE_ROWS_ALIGN = 2 * 8 * 2 * 8  # HopperMXScaleLayout at num_warps 8
VALUE_PREPAD = 64  # bytes, both dims (newer triton_kernels)
VALUE_PACK = (16, 32)  # HopperMXValueLayout's tile of (rows, bytes) at mma v3


def _up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def mxfp4_backend(gpu: GpuSpec, vllm_version: tuple[int, ...]) -> str:
    """The MoE backend vLLM runs MXFP4 experts with by default: flashinfer_trtllm, triton
    or marlin."""
    if gpu.supports("fp4"):
        return "flashinfer_trtllm"
    if gpu.architecture == "hopper" and vllm_version >= TRITON_ON_HOPPER_SINCE:
        return "triton"
    return "marlin"


def padded_sizes(backend: str, hidden: int, inter: float) -> tuple[int, int]:
    """(hidden, intermediate per rank) after the backend's padding (vLLM's
    `mxfp4_round_up_hidden_size_and_intermediate_size`)."""
    if backend == "flashinfer_trtllm":
        return _up(hidden, 256), _up(inter, 256)
    if backend == "marlin":
        return _up(hidden, 256), _up(inter, 128)
    return hidden, _up(inter, 64)


def _triton_value_bytes(rows: int, row_bytes: int, prepad: bool) -> int:
    if prepad:
        rows, row_bytes = _up(rows, VALUE_PREPAD), _up(row_bytes, VALUE_PREPAD)
    return _up(rows, VALUE_PACK[0]) * _up(row_bytes, VALUE_PACK[1])


def expert_bytes_per_rank(
    hidden: int, inter: float, bias: bool, gpu: GpuSpec, vllm_version: tuple[int, ...]
) -> float:
    """Bytes one routed expert holds on one of its ranks (`inter`: its intermediate size on
    that rank) under the backend vLLM `vllm_version` picks on `gpu`."""
    backend = mxfp4_backend(gpu, vllm_version)
    h, i = padded_sizes(backend, hidden, inter)
    # w13 (gate and up, 2i rows of h inputs) and w2 (h rows of i inputs)
    shapes = ((2 * i, h), (h, i))
    values = sum(rows * cols // 2 for rows, cols in shapes)
    scales = sum(rows * cols // MX_BLOCK for rows, cols in shapes)
    biases = (2 * i + h) if bias else 0
    if backend != "triton":
        # the bf16 biases are counted at the values' 0.53 B each, as before this module
        # (2 B would be right; not kept: see docs/plan.md, Wave 19: part 4)
        return values + scales + biases * (0.5 + 1 / MX_BLOCK)
    prepad = vllm_version >= VALUE_PREPAD_SINCE
    values = sum(_triton_value_bytes(rows, cols // 2, prepad) for rows, cols in shapes)
    swizzled = sum(_up(rows, SCALE_ROWS_ALIGN) * _up(cols // MX_BLOCK, 2) for rows, cols in shapes)
    return values + scales + swizzled + 4 * biases
