"""gpufleet.plan (see DESIGN.md)."""
