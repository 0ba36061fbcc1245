"""gpufleet.sim (see DESIGN.md)."""
