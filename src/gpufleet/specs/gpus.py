"""The GPU catalog (data in `data/gpus.yaml`) and its loader."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

from gpufleet.errors import UserError

MIB = 1 << 20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU kind. Bandwidths in gigaBYTES per second; TFLOP/s are dense (no sparsity)."""

    name: str
    memory_bytes: int
    hbm_gbps: float
    dense_tflops: Mapping[str, float]
    nvlink_gbps: float  # per GPU per direction inside a node; 0 = no NVLink-class fabric
    pcie_gbps: float
    network_gbps: float  # per GPU, between nodes
    price_per_gpu_hour_usd: float
    gpus_per_node: int
    nvlink_domain_gpus: int = 0  # GPUs reachable at intra_node_gbps (0: gpus_per_node)
    architecture: str = ""  # kernel generation: ampere, ada, hopper, blackwell, cdna3

    def tflops(self, dtype: str) -> float:
        """Dense tensor TFLOP/s for `dtype`; a dtype the GPU has no tensor path for runs at
        the nearest wider one (e.g. fp8 weights on an A100 are upcast to bf16 — vLLM's
        weight-only Marlin path)."""
        for d in _WIDER.get(dtype, (dtype,)):
            if d in self.dense_tflops:
                return self.dense_tflops[d]
        return self.dense_tflops["bf16"]

    def supports(self, dtype: str) -> bool:
        """True when the GPU has tensor cores for `dtype` (not an upcast fallback)."""
        return dtype in self.dense_tflops

    @property
    def intra_node_gbps(self) -> float:
        """Bandwidth one GPU has to its node peers: NVLink if any, else PCIe."""
        return self.nvlink_gbps if self.nvlink_gbps > 0 else self.pcie_gbps

    @property
    def domain_gpus(self) -> int:
        """GPUs one GPU reaches at intra_node_gbps: the node, or a multi-node NVLink
        domain (GB200 / GB300 NVL72: 72)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    def link_gbps(self, group_gpus: int) -> float:
        """Per-GPU bandwidth of a collective over `group_gpus` GPUs: the NVLink (or PCIe)
        fabric while the group fits its domain, else the inter-node network."""
        return self.intra_node_gbps if group_gpus <= self.domain_gpus else self.network_gbps


_WIDER: dict[str, tuple[str, ...]] = {
    "fp4": ("fp4", "fp8", "bf16"),
    "int4": ("int4", "int8", "bf16"),
    "fp8": ("fp8", "bf16"),
    "int8": ("int8", "bf16"),
    "fp16": ("fp16", "bf16"),
}


def _key(name: str) -> str:
    """Spelling-insensitive key: lower case, '_' and ' ' read as '-'."""
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@functools.cache
def _catalog() -> tuple[dict[str, GpuSpec], dict[str, str]]:
    text = resources.files("gpufleet.specs").joinpath("data/gpus.yaml").read_text()
    raw: dict[str, Any] = yaml.safe_load(text)["gpus"]
    specs: dict[str, GpuSpec] = {}
    aliases: dict[str, str] = {}
    for name, entry in raw.items():
        specs[name] = GpuSpec(
            name=name,
            memory_bytes=int(entry["memory_mib"]) * MIB,
            hbm_gbps=float(entry["hbm_gbps"]),
            dense_tflops=MappingProxyType({k: float(v) for k, v in entry["dense_tflops"].items()}),
            nvlink_gbps=float(entry["nvlink_gbps"]),
            pcie_gbps=float(entry["pcie_gbps"]),
            network_gbps=float(entry["network_gbps"]),
            price_per_gpu_hour_usd=float(entry["price_per_gpu_hour_usd"]),
            gpus_per_node=int(entry["gpus_per_node"]),
            nvlink_domain_gpus=int(entry.get("nvlink_domain_gpus", 0)),
            architecture=str(entry["architecture"]),
        )
        aliases[_key(name)] = name
        aliases[_key(name).replace("-", "")] = name
        for alias in entry.get("aliases", []):
            aliases[_key(alias)] = name
            aliases[_key(alias).replace("-", "")] = name
    return specs, aliases


def gpu_names() -> list[str]:
    """Canonical names of every GPU in the catalog."""
    return sorted(_catalog()[0])


def load_gpu(name: str) -> GpuSpec:
    """A catalog GPU by name or alias, case- and separator-insensitive
    (`H100`, `h100-sxm`, `h100_sxm`, `H200_SXM`)."""
    specs, aliases = _catalog()
    key = _key(name)
    canonical = aliases.get(key) or aliases.get(key.replace("-", ""))
    if canonical is None:
        close = difflib.get_close_matches(key, list(aliases), n=5, cutoff=0.5)
        close_names = sorted({aliases[c] for c in close})
        hint = f"close names: {', '.join(close_names)}" if close_names else ""
        raise UserError(
            f"unknown GPU {name!r}" + (f" ({hint})" if hint else ""),
            field="--gpu",
            fix=f"use one of: {', '.join(gpu_names())}",
        )
    return specs[canonical]
