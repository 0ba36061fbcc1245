"""gpufleet.routing (see DESIGN.md)."""
