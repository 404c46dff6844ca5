"""A full disk under the gateway's store, for real: the gateway runs in its own mount namespace
(``unshare``, no privileges needed) with its SQLite store on a 32 MiB tmpfs, which the test fills
through /proc/PID/root and empties again. While it is full queries are refused (503, nothing
charged); once space returns the WAL checkpoints resume, so the WAL stops growing and every
query is answered again (a checkpoint thread that died of the full disk let the WAL grow with
every commit until the disk was full again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlaas_monitor.store import WAL_TRUNCATE_BYTES, Store
from tests.polling import wait_until
from tests.procs import started
from tests.test_gateway_helpers import ADMIN_KEY, ROOT, Client, credit_model, credit_rows
from tests.test_live_disk_full import _fill, _namespaces_work

TMPFS_SIZE = "32m"
PREDICT = "/v1/models/credit/predict"


def _start_on_small_disk(tmp: Path, mnt: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The gateway (no monitor) with a copy of a store holding the credit model on a TMPFS_SIZE
    tmpfs at MNT; its log file. (SQLite resolves /proc/PID/root to / and would open the file
    under the mount point, not on the tmpfs: the store is made here and copied in.)"""
    log, port_file, made = tmp / "gateway.log", tmp / "ports.json", tmp / "made.db"
    store = Store(made)
    store.add_model(credit_model())
    store.close()
    script = (f"mount -t tmpfs -o size={TMPFS_SIZE} analysim-full {mnt} && cp {made} {mnt}/store.db && exec "
              f"{sys.executable} -m mlaas_monitor gateway --db {mnt}/store.db --port 0 --grpc-port 0 --no-monitor "
              f"--port-file {port_file}")
    proc = started(subprocess.Popen(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=ROOT,
                                    env={**os.environ, "ANALYSIM_ADMIN_KEY": ADMIN_KEY}, stdout=log.open("wb"),
                                    stderr=subprocess.STDOUT))  # fmt: skip
    wait_until(lambda: proc.poll() is not None or port_file.exists(), what="the gateway's port file")
    assert proc.poll() is None, log.read_text()
    return proc, log


def test_a_full_disk_does_not_stop_wal_checkpoints_for_good(tmp_path: Path) -> None:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if not _namespaces_work(mnt):
        pytest.skip("unshare cannot mount a tmpfs here (no unprivileged user namespaces)")
    proc, log = _start_on_small_disk(tmp_path, mnt)
    port = json.loads((tmp_path / "ports.json").read_text())["http"]
    # proc is unshare's pid: sh and then python replace it (exec), so its root is the gateway's.
    disk = Path(f"/proc/{proc.pid}/root") / str(mnt).lstrip("/")
    admin = Client("127.0.0.1", port, ADMIN_KEY)
    alice = Client("127.0.0.1", port, admin.post("/v1/admin/users", {"name": "alice"})[1]["api_key"])
    rows = credit_rows()
    for i in range(50):
        assert alice.post(PREDICT, {"rows": rows[i : i + 4]})[0] == 200
    filler = disk / "filler"
    _fill(filler)
    # A checkpoint fails when it must grow the database and cannot: free a little space, let
    # queries fill it with WAL frames (until one is refused), and again, until one has failed.
    statuses: list[int] = []

    def checkpoint_failed() -> bool:
        text = log.read_text()  # the failure logged (or, were the thread to die of it, its traceback)
        if "WAL checkpoint failed" in text or "wal-checkpoint" in text:
            return True
        os.truncate(filler, max(0, filler.stat().st_size - 256 * 1024))
        while (status := alice.post(PREDICT, {"rows": rows[:4]})[0]) == 200:
            pass
        statuses.append(status)
        return False

    wait_until(checkpoint_failed, what="a WAL checkpoint to fail on the full disk", poll_s=0.05)
    assert set(statuses) <= {503}, statuses
    filler.unlink()
    wal = disk / "store.db-wal"
    # Space is back: 2,000 more queries (each adds ~40 kB of WAL frames: far more than the disk
    # would hold without checkpoints) are all answered, and the WAL comes back within a bound.
    for i in range(2000):
        status, body = alice.post(PREDICT, {"rows": rows[i % 200 : i % 200 + 4]})
        assert status == 200, (i, body, wal.stat().st_size)
    wait_until(lambda: "WAL checkpoints work again" in log.read_text(), what="the checkpoints to resume")
    # (Under a steady stream of commits a truncating checkpoint may wait for a gap; once the
    # stream stops, the next one brings the WAL back within the bound.)
    wait_until(lambda: wal.stat().st_size <= WAL_TRUNCATE_BYTES, what="the WAL back within its bound")
    assert "Traceback" not in log.read_text()
