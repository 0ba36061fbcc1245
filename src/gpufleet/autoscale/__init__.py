"""gpufleet.autoscale (see DESIGN.md)."""
