"""How one replica is split over GPUs and in which precision."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.specs.dtypes import BYTES_PER_PARAM, KV_DTYPES, WEIGHT_DTYPES


@dataclass(frozen=True)
class Layout:
    """One replica: tp × pp GPUs.

    ep: MoE expert-parallel ranks. Experts are split across ep ranks instead of each
    expert being TP-sharded. vLLM's --enable-expert-parallel gives ep = tp × dp; with no
    attention data parallelism that is ep = tp, so ep is 1 or tp here.
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    weight_dtype: str = "bf16"  # bf16 | fp8 | int8 | int4 | fp4 (MXFP4 experts)
    kv_dtype: str = "bf16"  # bf16 | fp8

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"Layout.{name} must be >= 1, got {getattr(self, name)}")
        if self.ep != 1 and self.ep != self.tp:
            raise ValueError(f"Layout.ep must be 1 or tp ({self.tp}), got {self.ep}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"Layout.weight_dtype must be one of {WEIGHT_DTYPES}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"Layout.kv_dtype must be one of {KV_DTYPES}")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp

    @property
    def kv_dtype_bytes(self) -> float:
        return BYTES_PER_PARAM[self.kv_dtype]

    @property
    def label(self) -> str:
        parts = [f"TP={self.tp}"]
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        if self.ep > 1:
            parts.append(f"EP={self.ep}")
        return " ".join(parts) + f" {self.weight_dtype}/kv-{self.kv_dtype}"
