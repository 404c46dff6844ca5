"""``analysim model``: implemented with the service, in mlaas_monitor.commands.model."""

from mlaas_monitor.commands.model import register

__all__ = ["register"]
