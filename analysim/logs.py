"""Service logs the container way: to stdout, one line per record with a UTC timestamp,
the service and the level; ``--log-format json`` for one JSON object per line (for log
shippers)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

FORMATS = ("text", "json")


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
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
