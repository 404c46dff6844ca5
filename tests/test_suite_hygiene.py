"""The suite cleans up after itself: a test that times out while a gateway it started is
serving (with its monitor child), or a scheduler it started through LocalRun, leaves no process
behind; deadlines stretch with the machine's measured slowdown."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.polling import MAX_SLOWDOWN, scaled, slowdown, wait_until
from tests.test_gateway_durability import setup_store

ROOT = Path(__file__).resolve().parent.parent

# A test that starts a gateway (which starts its monitor), records their pids, and hangs
# until pytest-timeout fails it.
HANGS = """
import json, time
from pathlib import Path
import pytest
from tests.procs import descendants
from tests.test_gateway_helpers import start_module

@pytest.mark.timeout(5)
def test_hangs(tmp_path):
    proc, _ = start_module(["mlaas_monitor", "gateway", "--db", {db!r}, "--port", "0", "--grpc-port", "0"],
                           tmp_path / "ports.json", "the gateway's port file")
    Path({pids!r}).write_text(json.dumps([proc.pid, *descendants(proc.pid)]))
    while True:
        time.sleep(0.1)
"""


# A test that starts a scheduler through the tests' LocalRun, never stops it, and hangs until
# pytest-timeout fails it; the next test finds the scheduler gone already (not at the session's
# end, when the parent's death would take it too). Its timeout is a quiet machine's: tests.conftest
# stretches it by the slowdown (once; stretching it here too would square the slowdown).
HANGS_WITH_A_SCHEDULER = """
import time
import pytest
from tests.test_live_helpers import local_run
from tests.test_suite_hygiene import alive

PIDS = []

@pytest.mark.timeout(10)
def test_hangs(tmp_path):
    run = local_run(tmp_path / "procs")
    run.start_scheduler(["--jobs", "0", "--cluster", "2x8"])
    PIDS.append(run.scheduler.pid)
    while True:
        time.sleep(0.1)

def test_the_scheduler_is_gone():
    assert PIDS and not alive(PIDS[0])
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_test_that_times_out_leaves_no_gateway_nor_monitor_behind(tmp_path: Path) -> None:
    db, pids = tmp_path / "store.db", tmp_path / "pids.json"
    setup_store(db)
    inner = tmp_path / "test_inner.py"
    inner.write_text(textwrap.dedent(HANGS.format(db=str(db), pids=str(pids))))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                        "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(inner)],
                       cwd=ROOT, capture_output=True, text=True, timeout=scaled(120))  # fmt: skip
    assert r.returncode == 1 and "Timeout" in r.stdout, r.stdout[-3000:]
    started = json.loads(pids.read_text())
    assert len(started) >= 2, "the gateway did not start its monitor"
    wait_until(lambda: not any(alive(p) for p in started), 10, "the timed-out test's processes to be gone")


def test_a_test_that_times_out_leaves_no_scheduler_behind(tmp_path: Path) -> None:
    inner = tmp_path / "test_inner.py"
    inner.write_text(HANGS_WITH_A_SCHEDULER)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                        "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(inner)],
                       cwd=ROOT, capture_output=True, text=True, timeout=scaled(180))  # fmt: skip
    assert r.returncode == 1 and "Timeout" in r.stdout and "1 failed, 1 passed" in r.stdout, r.stdout[-3000:]


def test_slowdown_is_measured_and_bounded(request: pytest.FixtureRequest) -> None:
    assert 1.0 <= slowdown() <= MAX_SLOWDOWN
    assert scaled(30) == 30 * slowdown()
    # This test's own timeout too: the configured one, stretched.
    assert request.node.get_closest_marker("timeout").args[0] == scaled(float(request.config.getini("timeout")))
