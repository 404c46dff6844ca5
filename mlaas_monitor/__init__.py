"""mlaas_monitor: the MLaaS gateway (decision trees served pay-per-query over REST and gRPC,
per-user keys, billing ledger, durable store) and, next, its model-extraction monitor.

See docs/gateway.md. ``python -m mlaas_monitor gateway|model ...`` runs the commands."""
