"""``analysim monitor-eval``: implemented with the service, in mlaas_monitor.commands.monitor_eval."""

from mlaas_monitor.commands.monitor_eval import register

__all__ = ["register"]
