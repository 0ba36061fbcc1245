"""Compatibility import: the replica server lives in `gpufleet.replica.app` (lifecycle and
side endpoints), `generate` (requests → engine → answers), `streaming` (SSE), `faults`."""

from gpufleet.replica.app import ReplicaServer, serve

__all__ = ["ReplicaServer", "serve"]
