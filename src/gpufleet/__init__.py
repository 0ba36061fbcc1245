"""gpufleet: plan, run, route, autoscale and measure LLM inference fleets."""

__version__ = "0.1.0"
