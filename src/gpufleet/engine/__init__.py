"""gpufleet.engine (see DESIGN.md)."""
