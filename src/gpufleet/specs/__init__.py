"""gpufleet.specs (see DESIGN.md)."""
