"""The MLaaS commands (``gateway``, ``model``, ``attack``, ``monitor-eval``): each module has
``register(subparsers)`` and the function it runs. They live with the service; ``analysim``
and ``python -m mlaas_monitor[.monitor]`` register the same modules, so each behaves the same
under every entry point."""
