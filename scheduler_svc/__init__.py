"""The live scheduler service: drives the simulation core from the network (docs/live.md).

``python -m scheduler_svc serve ...``; ``scheduler_svc.client.SchedulerClient`` for clients.
"""
