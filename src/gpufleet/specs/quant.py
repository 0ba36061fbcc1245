"""Weight formats and a checkpoint's per-module quantization, read from `quantization_config`.

A checkpoint rarely quantizes every linear layer the same way: Meta's Llama-3.1-405B-FP8
keeps attention and the first and last layers in bf16, gpt-oss stores only its experts in
MXFP4, NVFP4 exports keep `lm_head` (and often routers) in bf16. `QuantScheme` says, for
each layer and module class (attention, dense MLP, routed experts, shared experts,
lm_head), which `WeightFormat` it is stored in. Memory and step time read bytes and
compute paths per module from it.

Ignore lists are matched the way each loader matches them: Hugging Face's
`modules_to_not_convert` (fbgemm_fp8, fp8, AWQ, GPTQ) by substring of the module name,
compressed-tensors' `ignore` by exact name or `re:` regex, ModelOpt's `exclude_modules`
and MXFP4's `modules_to_not_convert` by wildcard (`*`) or prefix.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal

from gpufleet.errors import UserError

ModuleClass = Literal["attn", "mlp", "experts", "shared", "lm_head"]
MODULE_CLASSES: Final[tuple[ModuleClass, ...]] = ("attn", "mlp", "experts", "shared", "lm_head")


@dataclass(frozen=True)
class WeightFormat:
    """How one linear layer's weights are stored and which tensor-core path multiplies them.

    bytes_per_param: storage per weight including its scales.
    act_dtype: the activation precision of the GEMM the engines run for it where the GPU
        has tensor cores for it: "bf16" (weight-only: AWQ/GPTQ Marlin, W4A16), "fp8"
        (W8A8, W4A8), "int8", "fp4" (W4A4 NVFP4). Elsewhere they fall back to a
        weight-only kernel at bf16 (e.g. NVFP4 or MXFP4 on Hopper through Marlin).
    """

    name: str
    bytes_per_param: float
    act_dtype: str = "bf16"

    @property
    def is_quantized(self) -> bool:
        return self.name not in ("bf16", "fp16", "fp32")


# The formats of the usual checkpoints (scale bytes per weight in the comment).
BF16: Final = WeightFormat("bf16", 2.0, "bf16")
FP8: Final = WeightFormat("fp8", 1.0, "fp8")  # per-tensor / per-channel scales: ~0
FP8_BLOCK: Final = WeightFormat("fp8", 1.0 + 4.0 / (128 * 128), "fp8")  # fp32 per 128x128
INT8: Final = WeightFormat("int8", 1.0, "int8")  # W8A8, per-channel scales
INT8_W8A16: Final = WeightFormat("int8", 1.0, "bf16")
# AWQ / GPTQ int4, group 128: an fp16 scale and a packed 4-bit zero per 128 weights.
INT4: Final = WeightFormat("int4", 0.5 + 2.5 / 128, "bf16")
# MXFP4 (OCP microscaling): one e8m0 shared exponent per 32 weights. Engines multiply it
# with fp8 activations on Blackwell (W4A8) and with bf16 ones on Hopper (W4A16).
MXFP4: Final = WeightFormat("mxfp4", 0.5 + 1.0 / 32, "fp8")
# NVFP4: an e4m3 scale per 16 weights (+ one fp32 per tensor). W4A4 on Blackwell.
NVFP4: Final = WeightFormat("nvfp4", 0.5 + 1.0 / 16, "fp4")
NVFP4_W4A16: Final = WeightFormat("nvfp4", 0.5 + 1.0 / 16, "bf16")

# What a layout may ask for by name (--quant), uniform over the decoder's linear layers.
FORMATS: Final[Mapping[str, WeightFormat]] = MappingProxyType(
    {"bf16": BF16, "fp8": FP8, "int8": INT8, "int4": INT4, "mxfp4": MXFP4, "nvfp4": NVFP4}
)
FORMAT_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {"fp4": "nvfp4", "w4a16": "int4", "awq": "int4", "gptq": "int4", "w8a8": "int8"}
)


def weight_format(name: str) -> WeightFormat:
    """A format by name (aliases: fp4 = nvfp4, awq/gptq/w4a16 = int4, w8a8 = int8)."""
    key = FORMAT_ALIASES.get(name.lower(), name.lower())
    if key not in FORMATS:
        raise UserError(
            f"unknown weight format {name!r}",
            field="--quant",
            fix=f"use one of {', '.join(FORMATS)}",
        )
    return FORMATS[key]


@dataclass(frozen=True)
class QuantScheme:
    """Per-module storage formats of one checkpoint (or of a uniform re-quantization).

    defaults: the format of each module class; overrides: (layer, class) pairs that differ
    (modules a checkpoint left unquantized). Embeddings, norms and routers are never
    quantized by the usual checkpoints and are always bf16. Hashable (a `ModelSpec` field).
    """

    defaults_items: tuple[tuple[str, WeightFormat], ...]
    overrides_items: tuple[tuple[tuple[int, str], WeightFormat], ...] = ()
    method: str = "none"  # quant_method of the checkpoint ("none": unquantized)
    kv_cache_dtype: str | None = None  # the checkpoint's calibrated KV dtype (e.g. fp8)

    @classmethod
    def of(
        cls,
        defaults: Mapping[str, WeightFormat],
        overrides: Mapping[tuple[int, str], WeightFormat] | None = None,
        method: str = "none",
        kv_cache_dtype: str | None = None,
    ) -> QuantScheme:
        return cls(
            tuple(sorted(defaults.items())),
            tuple(sorted((overrides or {}).items())),
            method,
            kv_cache_dtype,
        )

    @functools.cached_property
    def defaults(self) -> Mapping[str, WeightFormat]:
        return MappingProxyType(dict(self.defaults_items))

    @functools.cached_property
    def overrides(self) -> Mapping[tuple[int, str], WeightFormat]:
        return MappingProxyType(dict(self.overrides_items))

    def format(self, layer: int, module: str) -> WeightFormat:
        return self.overrides.get((layer, module)) or self.defaults.get(module, BF16)

    @property
    def headline(self) -> str:
        """The format most of the weights are in: the experts' for an MoE checkpoint whose
        experts are quantized, else the dense MLP's, else attention's."""
        for module in ("experts", "mlp", "attn"):
            fmt = self.defaults.get(module)
            if fmt is not None and fmt.is_quantized:
                return fmt.name
        return "bf16"

    def describe(self) -> str:
        order = [m for m in MODULE_CLASSES if m in self.defaults and m != "lm_head"]
        parts = [f"{m} {self.defaults[m].name}" for m in order]
        extra = f", {len(self.overrides)} modules kept bf16" if self.overrides else ""
        return f"{self.method}: " + ", ".join(parts) + extra


def uniform_scheme(fmt: WeightFormat) -> QuantScheme:
    """Every decoder linear layer in `fmt`; lm_head bf16 (as quantized checkpoints keep it).
    MXFP4, as gpt-oss ships it, quantizes only the experts."""
    if fmt.name == "mxfp4":
        dense = BF16
        return QuantScheme.of(
            {"attn": dense, "mlp": dense, "experts": fmt, "shared": dense, "lm_head": BF16},
            method="mxfp4",
        )
    return QuantScheme.of(
        {"attn": fmt, "mlp": fmt, "experts": fmt, "shared": fmt, "lm_head": BF16},
        method="none" if not fmt.is_quantized else fmt.name,
    )


UNQUANTIZED: Final = uniform_scheme(BF16)


# ---- module names ----------------------------------------------------------------------

# Representative module names per class, in the spellings the architectures use; an ignore
# pattern that matches any of them (or a parent) leaves that class unquantized in that layer.
_PREFIXES = (
    "model.layers.{i}",
    "model.language_model.layers.{i}",
    "language_model.model.layers.{i}",
)
_NAMES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "self_attn.qkv_proj", "self_attn.q_a_proj", "self_attn.q_b_proj",
                 "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj"),
        "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "feed_forward.gate_proj",
                "feed_forward.up_proj", "feed_forward.down_proj"),
        "experts": ("mlp.experts", "mlp.experts.0.gate_proj", "mlp.experts.0.down_proj",
                    "block_sparse_moe.experts.0.w1", "feed_forward.experts"),
        "shared": ("mlp.shared_experts.gate_proj", "mlp.shared_experts.down_proj",
                   "mlp.shared_expert.gate_proj", "mlp.shared_expert.down_proj",
                   "feed_forward.shared_expert.gate_proj"),
    }
)  # fmt: skip


@functools.cache
def _candidates(layer: int, module: str) -> tuple[str, ...]:
    if module == "lm_head":
        return ("lm_head",)
    return tuple(p.format(i=layer) + "." + n for p in _PREFIXES for n in _NAMES[module])


Matching = Literal["substring", "exact_or_regex", "wildcard"]


def _matches(pattern: str, name: str, how: Matching) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if how == "substring":
        return pattern.removesuffix(".weight") in name
    if "*" in pattern or (how == "wildcard" and ("?" in pattern or "[" in pattern)):
        return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")
    return name == pattern or name.startswith(pattern + ".")


def _excluded(layer: int, module: str, patterns: Iterable[str], how: Matching) -> bool:
    return any(_matches(p, n, how) for p in patterns for n in _candidates(layer, module))


def _scheme(
    base: Mapping[str, WeightFormat],
    num_layers: int,
    ignore: list[str],
    how: Matching,
    method: str,
    kv_cache_dtype: str | None = None,
) -> QuantScheme:
    """Defaults from `base`; every (layer, class) an ignore pattern hits stays bf16."""
    defaults = dict(base)
    defaults.setdefault("lm_head", BF16)
    if defaults["lm_head"].is_quantized and _excluded(0, "lm_head", ignore, how):
        defaults["lm_head"] = BF16
    overrides: dict[tuple[int, str], WeightFormat] = {}
    if ignore:
        for layer in range(num_layers):
            for module in ("attn", "mlp", "experts", "shared"):
                if defaults.get(module, BF16).is_quantized and _excluded(
                    layer, module, ignore, how
                ):
                    overrides[(layer, module)] = BF16
    # A class quantized in no layer at all is bf16 by default (e.g. gpt-oss attention).
    for module in ("attn", "mlp", "experts", "shared"):
        if num_layers and all((i, module) in overrides for i in range(num_layers)):
            defaults[module] = BF16
            for i in range(num_layers):
                del overrides[(i, module)]
    return QuantScheme.of(defaults, overrides, method, kv_cache_dtype)


def _all(fmt: WeightFormat) -> dict[str, WeightFormat]:
    return {"attn": fmt, "mlp": fmt, "experts": fmt, "shared": fmt, "lm_head": BF16}


# ---- quantization_config readers --------------------------------------------------------


def _ct_format(group: Mapping[str, Any], fmt_name: str) -> WeightFormat:
    """A compressed-tensors config group's weight format."""
    weights = group.get("weights") or {}
    acts = group.get("input_activations") or {}
    bits = int(weights.get("num_bits", 16))
    kind = str(weights.get("type", "int"))
    act_bits = int(acts.get("num_bits", 16)) if acts else 16
    if bits == 8 and kind == "float":
        return FP8 if act_bits == 8 else WeightFormat("fp8", 1.0, "bf16")
    if bits == 8:
        return INT8 if act_bits == 8 else INT8_W8A16
    if bits == 4 and kind == "float":
        group_size = int(weights.get("group_size") or 16)
        if group_size == 32 or "mxfp4" in fmt_name:
            return MXFP4
        return NVFP4 if act_bits == 4 else NVFP4_W4A16
    if bits == 4:
        group_size = int(weights.get("group_size") or 128)
        zero = 0.0 if weights.get("symmetric", True) else 0.5
        return WeightFormat("int4", 0.5 + (2.0 + zero) / group_size, "bf16")
    raise UserError(
        f"compressed-tensors weights of {bits} bits ({kind}) are not understood",
        field="quantization_config",
        fix="use an 8-bit or 4-bit checkpoint, or a bf16 one with --quant",
    )


def _compressed_tensors(q: Mapping[str, Any], num_layers: int) -> QuantScheme:
    groups = dict(q.get("config_groups") or {})
    fmt_name = str(q.get("format", ""))
    base: dict[str, WeightFormat] = {}
    for group in groups.values():
        fmt = _ct_format(group, str(group.get("format") or fmt_name))
        targets = [str(t) for t in group.get("targets") or ["Linear"]]
        if any(t in ("Linear", "re:.*") for t in targets):
            for m in ("attn", "mlp", "experts", "shared"):
                base.setdefault(m, fmt)
        if any("FusedMoE" in t or "experts" in t for t in targets):
            base["experts"] = fmt
        if any("lm_head" in t for t in targets):
            base["lm_head"] = fmt
    kv = q.get("kv_cache_scheme")
    kv_dtype = "fp8" if isinstance(kv, dict) and kv.get("num_bits") == 8 else None
    ignore = [str(p) for p in q.get("ignore") or []]
    return _scheme(base, num_layers, ignore, "exact_or_regex", "compressed-tensors", kv_dtype)


def _modelopt(q: Mapping[str, Any], num_layers: int) -> QuantScheme:
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else q
    assert isinstance(inner, Mapping)
    algo = str(inner.get("quant_algo", "")).upper()
    kv = "fp8" if str(inner.get("kv_cache_quant_algo", "")).upper() == "FP8" else None
    by_algo = {"FP8": FP8, "FP8_BLOCK_SCALES": FP8_BLOCK, "NVFP4": NVFP4,
               "W4A16_NVFP4": NVFP4_W4A16, "W4A8_NVFP4_FP8": WeightFormat("nvfp4", 0.5625, "fp8"),
               "MXFP4": MXFP4, "W4A16_AWQ": INT4, "W4A8_AWQ": WeightFormat("int4", 0.5 + 2 / 128, "fp8"),
               "INT8_SQ": INT8}  # fmt: skip
    if algo == "MIXED_PRECISION":
        layers = inner.get("quantized_layers") or {}
        base: dict[str, WeightFormat] = {}
        for name, spec in layers.items():
            fmt = by_algo.get(str(spec.get("quant_algo", "")).upper())
            if fmt is None:
                continue
            for module in ("attn", "mlp", "experts", "shared"):
                if any(_matches(str(name), n, "exact_or_regex") for n in _candidates(1, module)):
                    base.setdefault(module, fmt)
        return _scheme(base, 0, [], "wildcard", "modelopt", kv)
    if algo not in by_algo:
        raise UserError(
            f"ModelOpt quant_algo {algo!r} is not understood",
            field="quantization_config",
            fix=f"use one of {', '.join(by_algo)}",
        )
    ignore = [str(p) for p in inner.get("exclude_modules") or inner.get("ignore") or []]
    return _scheme(_all(by_algo[algo]), num_layers, ignore, "wildcard", "modelopt", kv)


def parse_quantization_config(cfg: Mapping[str, Any], num_layers: int) -> QuantScheme:
    """The checkpoint's per-module formats from a config.json's `quantization_config`
    (absent: unquantized). An unknown method is a UserError naming it, never a silent
    bf16 (which would misstate memory by 2-4x)."""
    q = cfg.get("quantization_config") or cfg.get("compression_config")
    if not q:
        return UNQUANTIZED
    if not isinstance(q, Mapping):
        raise UserError("quantization_config is not an object", field="quantization_config")
    method = str(q.get("quant_method", "")).lower()
    if method == "compressed-tensors" or (not method and "config_groups" in q):
        return _compressed_tensors(q, num_layers)
    if method in ("modelopt", "modelopt_fp4", "modelopt_fp8") or "quant_algo" in q:
        return _modelopt(q, num_layers)
    ignore = [str(p) for p in q.get("modules_to_not_convert") or q.get("ignored_layers") or []]
    # vLLM skips fp8 / fbgemm_fp8 layers whose name is in the list (or under one that is);
    # AWQ / GPTQ lists it matches by substring.
    if method == "fp8":
        fmt = FP8_BLOCK if q.get("weight_block_size") else FP8
        return _scheme(_all(fmt), num_layers, ignore, "exact_or_regex", "fp8")
    if method == "fbgemm_fp8":
        return _scheme(_all(FP8), num_layers, ignore, "exact_or_regex", "fbgemm_fp8")
    if method == "mxfp4":
        base = {"attn": BF16, "mlp": BF16, "experts": MXFP4, "shared": BF16}
        return _scheme(base, num_layers, ignore, "wildcard", "mxfp4")
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "auto_round"):
        bits = int(q.get("bits") or q.get("w_bit") or 4)
        group = int(q.get("group_size") or q.get("q_group_size") or 128)
        if group <= 0:  # GPTQ's -1: one scale per output channel
            group = 1 << 30
        if bits == 8:
            return _scheme(_all(INT8_W8A16), num_layers, ignore, "substring", method)
        zero = 0.5 if (method.startswith("awq") or not q.get("sym", True)) else 0.0
        fmt = WeightFormat("int4", 0.5 + (2.0 + zero) / group, "bf16")
        return _scheme(_all(fmt), num_layers, ignore, "substring", method)
    raise UserError(
        f"quant_method {method!r} is not understood",
        field="quantization_config",
        fix="supported: fp8, fbgemm_fp8, compressed-tensors, modelopt, mxfp4, awq, gptq",
    )
