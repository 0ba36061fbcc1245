"""gpufleet.replica (see DESIGN.md)."""
