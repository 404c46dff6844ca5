"""Fake GPU node agents for the live scheduler service (docs/live.md): ``python -m node_agent ...``."""
