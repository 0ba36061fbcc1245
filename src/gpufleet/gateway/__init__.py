"""gpufleet.gateway (see DESIGN.md)."""
