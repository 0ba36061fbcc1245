"""Collective-communication times for the step-time model: all-reduce, all-to-all, send/recv.

An all-reduce does not run at one bandwidth: small messages pay a fixed per-call latency,
and the achieved bus bandwidth climbs with message size towards the link's peak. The curve
below is nccl-tests' measured all-reduce bus bandwidth on 8 x H100 SXM (NVLink 4, 450 GB/s
per GPU per direction): ~17 µs for 16 KiB, 240 GB/s at 16 MiB, 362 GB/s at 64 MiB, 445 GB/s
at 512 MiB. Other fabrics scale the bandwidth by their link speed (the curve's shape — how
fast a message fills the pipe — is kept). Decode steps all-reduce ~0.1-2 MiB per call, so
the latency end of the curve is what matters most there, and a constant bandwidth would be
wrong by 5-10x.

The engines do not call NCCL for those small messages: over NVLink peer-to-peer they run
their own one-/two-shot all-reduce kernels (vLLM's custom all-reduce, which SGLang reuses,
up to 8 MiB on 8 GPUs; TRT-LLM's AllReduce one-/two-shot strategies), a few microseconds of
synchronisation plus the bytes at link speed. NCCL's mid-size curve (~33 GB/s at 1 MiB)
would cost a 1 MiB decode all-reduce ~35 µs where those kernels take ~10.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

KIB = 1 << 10
MIB = 1 << 20
# vLLM's custom all-reduce limit on 8 Hopper GPUs (larger messages go to NCCL).
CUSTOM_ALL_REDUCE_MAX_BYTES = 8 * MIB

# (message bytes, bus bandwidth GB/s) measured on 8 x H100 SXM; bus bandwidth is nccl-tests'
# algbw x 2(n-1)/n, i.e. the bytes each GPU actually moves per second.
_H100_NVLINK_GBPS = 450.0
_H100_BUSBW_POINTS: tuple[tuple[float, float], ...] = (
    (16 * KIB, 16 * KIB * 2 * 7 / 8 / 17e-6 / 1e9),  # latency-bound: 17 µs per call
    (16 * MIB, 240.0),
    (64 * MIB, 362.0),
    (512 * MIB, 445.0),
)
_LOG_SIZES = tuple(math.log(s) for s, _ in _H100_BUSBW_POINTS)
_LOG_BWS = tuple(math.log(b) for _, b in _H100_BUSBW_POINTS)


@dataclass(frozen=True, slots=True)
class AllReduceCurve:
    """All-reduce time vs message size on one fabric.

    link_gbps: per-GPU per-direction bandwidth of the fabric the group talks over.
    latency_s: time of a tiny all-reduce (per call). Engines use custom one-shot kernels
    for small messages (vLLM's custom all-reduce, TRT-LLM's), faster than NCCL's 17 µs,
    so the calibrated value is usually lower.
    """

    link_gbps: float
    latency_s: float = 17e-6
    # Messages up to this size use the engines' own NVLink kernels (0: NCCL only, e.g. over
    # PCIe or the network, where peer-to-peer one-shot kernels do not run).
    custom_max_bytes: float = 0.0

    def bus_gbps(self, message_bytes: float) -> float:
        """Achieved bus bandwidth for one message: log-log interpolation of the measured curve."""
        scale = self.link_gbps / _H100_NVLINK_GBPS
        if message_bytes <= _H100_BUSBW_POINTS[0][0]:
            return _H100_BUSBW_POINTS[0][1] * scale * message_bytes / _H100_BUSBW_POINTS[0][0]
        if message_bytes >= _H100_BUSBW_POINTS[-1][0]:
            return _H100_BUSBW_POINTS[-1][1] * scale
        x = math.log(message_bytes)
        i = bisect.bisect_right(_LOG_SIZES, x) - 1
        frac = (x - _LOG_SIZES[i]) / (_LOG_SIZES[i + 1] - _LOG_SIZES[i])
        return math.exp(_LOG_BWS[i] + frac * (_LOG_BWS[i + 1] - _LOG_BWS[i])) * scale

    def all_reduce_s(self, message_bytes: float, group_size: int) -> float:
        """Seconds for one all-reduce of `message_bytes` (the tensor size) over `group_size` GPUs."""
        if group_size <= 1 or message_bytes <= 0:
            return 0.0
        moved_bytes = message_bytes * 2 * (group_size - 1) / group_size
        if message_bytes <= self.custom_max_bytes:
            # Two-shot over NVLink P2P: reduce-scatter + all-gather at link speed.
            return self.latency_s + moved_bytes / (self.link_gbps * 1e9)
        # The bandwidth part uses the curve's bandwidth, floored by the per-call latency.
        bw_s = moved_bytes / (self.bus_gbps(message_bytes) * 1e9)
        h100_latency_s = 17e-6
        # Below the latency knee the curve is pure latency; replace NCCL's with ours.
        return max(self.latency_s, bw_s - h100_latency_s + self.latency_s)


def all_to_all_s(
    bytes_per_gpu: float, group_size: int, link_gbps: float, latency_s: float
) -> float:
    """One all-to-all where each GPU sends `bytes_per_gpu` in total, (n-1)/n of it off-GPU."""
    if group_size <= 1 or bytes_per_gpu <= 0:
        return 0.0
    off_gpu = bytes_per_gpu * (group_size - 1) / group_size
    return latency_s + off_gpu / (link_gbps * 1e9)


def send_recv_s(message_bytes: float, link_gbps: float, latency_s: float) -> float:
    """Point-to-point transfer between pipeline stages."""
    if message_bytes <= 0:
        return 0.0
    return latency_s + message_bytes / (link_gbps * 1e9)
