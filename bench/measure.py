"""One command measured as its own child process: wall time, CPU time and peak RSS.

CPU and peak RSS come from ``os.wait4``, so they are the child's own plus those of the processes it
started and waited for (a benchmark's gateway, agents or monitor), and nothing else on the machine:
on a shared machine whose load moves by 2x within minutes, CPU time is the steadier figure.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Measured:
    """What one child process cost, or that it outlived its time limit."""

    wall_s: float  # from start to exit (or to the kill, when timed out)
    user_s: float  # user CPU of the child and the descendants it waited for
    sys_s: float  # system CPU, likewise
    peak_rss_mb: float  # the largest resident set among them, MiB
    exit_code: int  # the child's exit status (negative: killed by that signal)
    timed_out: bool  # killed at the time limit: the other fields say little

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


def run_measured(cmd: list[str], timeout_s: float | None = None, stdout: object = subprocess.DEVNULL,
                 stderr: object = subprocess.DEVNULL, cwd: Path = ROOT, env: dict | None = None) -> Measured:
    """Run ``cmd`` from ``cwd`` (in ``env``, default this process's) and measure it; a child past
    ``timeout_s`` seconds is killed."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, cwd=cwd, env=env)
    timed_out = False
    while True:  # os.wait4 has no timeout: poll this one child when there is one
        pid, status, usage = os.wait4(proc.pid, 0 if timeout_s is None else os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > started + timeout_s:  # type: ignore[operator]
            proc.kill()
            timed_out = True
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Measured(wall_s=time.perf_counter() - started, user_s=usage.ru_utime, sys_s=usage.ru_stime,
                    peak_rss_mb=usage.ru_maxrss / 1024, exit_code=proc.returncode, timed_out=timed_out)
