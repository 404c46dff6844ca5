"""``python -m node_agent``."""

from node_agent.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
