"""AnalySIM: a trace-driven emulator for multi-tenant GPU clusters, and an MLaaS extraction monitor."""

__version__ = "0.1.0"
