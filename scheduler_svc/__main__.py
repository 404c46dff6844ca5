"""``python -m scheduler_svc``."""

from scheduler_svc.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
