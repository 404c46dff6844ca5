"""``analysim attack``: implemented with the service, in mlaas_monitor.commands.attack."""

from mlaas_monitor.commands.attack import register

__all__ = ["register"]
