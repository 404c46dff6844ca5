"""``analysim gateway``: implemented with the service, in mlaas_monitor.commands.gateway."""

from mlaas_monitor.commands.gateway import register

__all__ = ["register"]
