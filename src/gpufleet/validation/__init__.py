"""gpufleet.validation: the performance model checked against measured serving rows.

Above both `gpufleet.engine` and `gpufleet.plan`: `measured` reads and predicts the rows,
`engine_loop` plays a row's closed loop on the engine, `fit` refits the constants.
"""
