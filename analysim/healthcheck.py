"""``python -m analysim.healthcheck [/healthz|/readyz]``: exit 0 when this container's
service answers 200 on its metrics port ($ANALYSIM_METRICS_PORT, default 9100), else 1 —
the image's HEALTHCHECK, with nothing but the standard library."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_PORT = "9100"


def check(path: str = "/healthz", env: dict[str, str] | None = None, timeout_s: float = 3.0) -> tuple[bool, str]:
    env = dict(os.environ) if env is None else env
    url = f"http://127.0.0.1:{env.get('ANALYSIM_METRICS_PORT', DEFAULT_PORT)}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200, f"{url}: {r.status}"
    except (urllib.error.URLError, OSError) as e:
        return False, f"{url}: {e}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ok, why = check(argv[0] if argv else "/healthz")
    print(why)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
