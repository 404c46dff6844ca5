"""``python -m analysim.healthcheck [/healthz|/readyz] [--port P] [--key-file F]``: exit 0
when this container's service answers 200 on its metrics port ($ANALYSIM_METRICS_PORT,
default 9100, or ``--port``), else 1 — the image's HEALTHCHECK, with nothing but the
standard library. ``--key-file`` sends the key in it as a bearer token, for a service whose
every route needs one (the monitor service: ``/metrics --port 8070 --key-file ...``)."""

from __future__ import annotations

import argparse
import os
import urllib.error
import urllib.request

DEFAULT_PORT = "9100"


def check(path: str = "/healthz", env: dict[str, str] | None = None, timeout_s: float = 3.0,
          port: int | None = None, key: str | None = None) -> tuple[bool, str]:  # fmt: skip
    env = dict(os.environ) if env is None else env
    url = f"http://127.0.0.1:{port or env.get('ANALYSIM_METRICS_PORT', DEFAULT_PORT)}{path}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return r.status == 200, f"{url}: {r.status}"
    except (urllib.error.URLError, OSError) as e:
        return False, f"{url}: {e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysim.healthcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", nargs="?", default="/healthz")
    parser.add_argument("--port", type=int, help="port to ask (default $ANALYSIM_METRICS_PORT, else 9100)")
    parser.add_argument("--key-file", help="file holding a bearer token to send")
    args = parser.parse_args(argv)
    key = None
    if args.key_file:
        try:
            with open(args.key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as e:
            print(f"--key-file: cannot read {args.key_file}: {e}")
            return 1
    ok, why = check(args.path, port=args.port, key=key)
    print(why)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
