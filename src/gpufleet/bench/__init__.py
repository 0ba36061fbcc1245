"""gpufleet.bench (see DESIGN.md)."""
