"""The deterministic simulation core: pure, no I/O, no wall-clock reads."""
