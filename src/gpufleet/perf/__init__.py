"""gpufleet.perf: how long one engine iteration takes (below the engine and the planner).

`step_time` holds the `StepTimeModel` interface and the linear model; `roofline` the
per-layer roofline model of a layout; `comm` the collective-communication costs;
`calibration` the few fitted physical constants (`data/calibration.yaml`).
"""
