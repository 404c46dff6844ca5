"""Finding the processes a test started, to kill one with a real signal: by descent from a pid we
own, never by name; and killing every process a test started when it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# The processes the running test started (through ``started``), killed with their descendants
# when it ends, whichever way it ends: a timeout or a failed assertion leaves nothing behind.
_STARTED: list[subprocess.Popen] = []


def started(proc: subprocess.Popen) -> subprocess.Popen:
    """PROC, to be killed (with every process it started) when the current test ends."""
    _STARTED.append(proc)
    return proc


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL PROC and everything it started (found before the kill, as orphans are
    re-parented), then reap PROC. Once PROC is reaped its pid may be another's: nothing is killed."""
    if proc.poll() is None:
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=10)


def kill_started() -> None:
    """Kill what the current test started and has not already stopped."""
    while _STARTED:
        kill_tree(_STARTED.pop())
