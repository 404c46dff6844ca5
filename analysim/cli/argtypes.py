"""The argparse value types, for the subcommands (defined in analysim.argtypes, which the
services' entry points use too without importing the CLI)."""

from analysim.argtypes import (
    fraction,
    nonneg_int,
    percent,
    port,
    positive_int,
    positive_number,
    positive_seconds,
    rate,
    seconds,
    wall_seconds,
)

__all__ = ["fraction", "nonneg_int", "percent", "port", "positive_int", "positive_number", "positive_seconds", "rate", "seconds",
           "wall_seconds"]
