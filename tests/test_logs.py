"""The services' log set-up (analysim.logs): what a cancelled gRPC call leaves in the log."""

from __future__ import annotations

import asyncio
import logging

import pytest

from analysim.logs import setup_logging


def _log_cancelled(logger: str) -> None:
    try:
        raise asyncio.CancelledError
    except asyncio.CancelledError:
        logging.getLogger(logger).exception("Exception not handled by _handle_exceptions in servicer method [%s]",
                                            "/analysim.v1.AgentService/Connect")


def test_a_grpc_call_cancelled_as_it_ends_is_one_line_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """gRPC's aio server logs a servicer task cancelled while gRPC sends its last status (the
    agent gone, the server stopping) with a traceback from its own frames; the services log it as
    one INFO line naming the method. The same exception from our own code keeps its traceback."""
    try:
        setup_logging("scheduler")
        _log_cancelled("grpc._cython.cygrpc")
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 1 and " scheduler INFO " in lines[0], lines
        assert "/analysim.v1.AgentService/Connect" in lines[0] and "cancelled as it ended" in lines[0]
        _log_cancelled("scheduler_svc")
        out = capsys.readouterr().out
        assert " scheduler ERROR " in out and "Traceback" in out and "CancelledError" in out
    finally:
        logging.basicConfig(handlers=[logging.NullHandler()], force=True)


def test_a_grpc_call_cancelled_as_it_ends_is_not_logged_from_warning_up(capsys: pytest.CaptureFixture[str]) -> None:
    """The line is INFO: a service started with --log-level WARNING does not show it (gRPC logged
    it at ERROR, so the level was passed before it was known for what it is)."""
    try:
        setup_logging("scheduler", "WARNING")
        _log_cancelled("grpc._cython.cygrpc")
        assert capsys.readouterr().out == ""
        _log_cancelled("scheduler_svc")
        assert " scheduler ERROR " in capsys.readouterr().out
    finally:
        logging.basicConfig(handlers=[logging.NullHandler()], force=True)
