"""Service logs the container way: to stdout, one line per record with a UTC timestamp,
the service and the level; ``--log-format json`` for one JSON object per line (for log
shippers).

Rate-limited per source: lines of one message template from one source (``extra={"source":
...}``, e.g. an agent id; else the logger) pass at most ``BURST`` at once and ``PER_S`` a
second after that. The others are counted (``suppressed``, exported by the services as
``analysim_log_lines_suppressed_total``) and the next line that passes says how many of its
kind were left out: one peer sending a flood of bad reports cannot turn it into a flood of
log lines (a 3.3 MB message once made 36.5 MB of log)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time

FORMATS = ("text", "json")
BURST, PER_S = 20, 1.0


class RateLimit(logging.Filter):
    def __init__(self, burst: int = BURST, per_s: float = PER_S) -> None:
        super().__init__()
        self.burst, self.per_s = burst, per_s
        self._buckets: dict[tuple[str, object, str], list[float]] = {}  # key -> [tokens, stamp, left out]
        self.suppressed: dict[str, int] = {}  # source -> lines left out, in all

    def filter(self, record: logging.LogRecord) -> bool:
        source = str(getattr(record, "source", record.name))
        key = (record.name, record.msg, source)
        now = time.monotonic()
        b = self._buckets.get(key)
        if b is None:
            if len(self._buckets) > 10_000:  # bounded: forget the quiet ones
                self._buckets.clear()
            b = self._buckets[key] = [float(self.burst), now, 0]
        b[0] = min(float(self.burst), b[0] + (now - b[1]) * self.per_s)
        b[1] = now
        if b[0] < 1.0:
            b[2] += 1
            self.suppressed[source] = self.suppressed.get(source, 0) + 1
            return False
        b[0] -= 1.0
        if b[2]:
            record.msg = f"{record.msg} ({int(b[2])} similar line(s) from {source.replace('%', '%%')} left out)"
            b[2] = 0
        return True


RATE_LIMIT = RateLimit()


class CancelledRpc(logging.Filter):
    """gRPC's asyncio server logs an RPC whose task is cancelled as it ends (its peer gone, or
    the server stopping, while gRPC itself sends the last status) as "Exception not handled ...
    in servicer method" with a traceback, raised inside gRPC, past where the servicer could
    catch it. It is neither unhandled nor an error of ours: one line, at INFO, no traceback (and
    none at all where the service logs from WARNING up: its level was checked at ERROR)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError) and record.name.startswith("grpc"):
            record.msg = f"{record.getMessage()}: cancelled as it ended (its peer gone, or the server stopping)"
            record.args, record.exc_info, record.exc_text, record.stack_info = None, None, None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


def add_logging_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default="INFO", type=str.upper,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], help="default INFO")
    p.add_argument("--log-format", default="text", choices=FORMATS, help="text (default) or json, one record per line")


class _Formatter(logging.Formatter):
    """UTC timestamps with milliseconds; text or one JSON object per record."""

    def __init__(self, service: str, fmt: str) -> None:
        super().__init__(f"%(asctime)s {service} %(levelname)s %(message)s")
        self.service, self.json = service, fmt == "json"

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        if not self.json:
            return super().format(record)
        out = {"ts": self.formatTime(record), "level": record.levelname, "service": self.service,
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(service: str, level: str = "INFO", fmt: str = "text") -> None:
    """Root logger to stdout (replacing any earlier set-up)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Formatter(service, fmt))
    handler.addFilter(CancelledRpc())
    handler.addFilter(RATE_LIMIT)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
