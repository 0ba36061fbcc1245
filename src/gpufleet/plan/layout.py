"""How one replica is split over GPUs and in which precision."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.specs.dtypes import BYTES_PER_PARAM, KV_DTYPES, WEIGHT_DTYPES


@dataclass(frozen=True)
class Layout:
    """One replica: tp × dp × pp GPUs.

    tp: tensor-parallel ranks of the attention (and dense layers) in one attention group.
    dp: attention data-parallel ranks (DeepSeek-style serving of large MoE): each rank runs
        attention on its own requests with its own KV cache, while the MoE layers see the
        tokens of every rank. 1 for ordinary TP layouts.
    ep: expert-parallel ranks of the MoE layers: experts split whole over ep GPUs, each
        expert TP-sharded over the remaining tp × dp / ep (`moe_tp`). vLLM's
        --enable-expert-parallel and SGLang's --ep give ep = tp × dp.
    pp: pipeline stages (a stage is tp × dp GPUs).
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    weight_dtype: str = "bf16"  # bf16 | fp8 | int8 | int4 | mxfp4 | nvfp4
    kv_dtype: str = "bf16"  # bf16 | fp8
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"Layout.{name} must be >= 1, got {getattr(self, name)}")
        if (self.tp * self.dp) % self.ep:
            raise ValueError(f"Layout.ep must divide tp × dp ({self.tp * self.dp}), got {self.ep}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"Layout.weight_dtype must be one of {WEIGHT_DTYPES}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"Layout.kv_dtype must be one of {KV_DTYPES}")

    @property
    def stage_gpus(self) -> int:
        """GPUs of one pipeline stage: the attention groups together (the MoE group)."""
        return self.tp * self.dp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def moe_tp(self) -> int:
        """How many ways each expert is split: the stage's GPUs not used for EP."""
        return self.stage_gpus // self.ep

    @property
    def kv_dtype_bytes(self) -> float:
        return BYTES_PER_PARAM[self.kv_dtype]

    @property
    def label(self) -> str:
        parts = [f"TP={self.tp}"]
        if self.dp > 1:
            parts.append(f"DP={self.dp}")
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        if self.ep > 1:
            parts.append(f"EP={self.ep}")
        return " ".join(parts) + f" {self.weight_dtype}/kv-{self.kv_dtype}"
