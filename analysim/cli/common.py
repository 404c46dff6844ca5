"""The run inputs the simulation commands share (simulate, compare, up, sweep), defined in the
library module analysim.inputs so that the live scheduler service uses them without the CLI."""

from analysim.inputs import (
    DEFAULT_CLUSTER,
    DEFAULT_RATE_SCALE,
    DEFAULT_SYNTHETIC_JOBS,
    RUN_ONLY,
    SYNTHETIC_ONLY,
    add_run_arguments,
    load_inputs,
    read_trace,
    run_options,
    trace_inputs,
)

__all__ = ["DEFAULT_CLUSTER", "DEFAULT_RATE_SCALE", "DEFAULT_SYNTHETIC_JOBS", "RUN_ONLY", "SYNTHETIC_ONLY",
           "add_run_arguments", "load_inputs", "read_trace", "run_options", "trace_inputs"]
