"""gpufleet.fleet: one config for gateway + autoscaler + replicas, and the `up` runner."""
