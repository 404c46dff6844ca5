"""A full disk under the scheduler's journal, for real: the scheduler runs in its own mount
namespace (``unshare``, no privileges needed) with the journal on a 4 MiB tmpfs; the test fills
that tmpfs through /proc/PID/root and empties it again. A refused submission is refused for
good (never run, never half-known), acknowledged ones are all kept, reads go on, and the
scheduler resumes taking work when space returns."""

from __future__ import annotations

import errno
import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import grpc
import pytest

from analysim._protos.v1 import scheduler_pb2 as spb
from analysim.clusters import parse_cluster
from analysim.rpc_status import refusal_of
from scheduler_svc.launcher import ROOT
from tests.polling import scaled
from tests.test_live_helpers import http_get, local_run, sample_sum, scrape, wait_until

TMPFS_SIZE = "4m"


def _namespaces_work(mnt: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                        f"mount -t tmpfs -o size=64k analysim-probe {mnt}"], capture_output=True)
    return r.returncode == 0


def _wrapper(tmp: Path, mnt: Path) -> Path:
    """An interpreter that runs python in a mount namespace of its own, with ``mnt`` a small tmpfs."""
    w = tmp / "python-on-small-disk"
    w.write_text("#!/bin/sh\nexec unshare --user --map-root-user --mount sh -c "
                 f"'mount -t tmpfs -o size={TMPFS_SIZE} analysim-full \"$0\" && exec \"$@\"' "
                 f"{mnt} {sys.executable} \"$@\"\n")
    w.chmod(0o755)
    return w


def _fill(path: Path) -> None:
    """Write zeros into ``path`` until the filesystem is full."""
    block = b"\0" * 65536
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
    with path.open("ab", buffering=0) as f:  # and the last few bytes of the last block
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


def _ready(host: str, port: int) -> tuple[int, str]:
    return http_get(host, port, "/readyz")


def test_disk_full_refuses_submissions_keeps_serving_and_resumes(tmp_path: Path) -> None:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if not _namespaces_work(mnt):
        pytest.skip("unshare cannot mount a tmpfs here (no unprivileged user namespaces)")
    cluster = "4x8"
    run = local_run(tmp_path / "procs", python=str(_wrapper(tmp_path, mnt)))
    try:
        run.provision([n.name for n in parse_cluster(cluster).nodes], 1)
        run.start_scheduler(["--jobs", "0", "--journal", str(mnt / "journal.db"), "--cluster", cluster,
                             "--log-level", "WARNING"])
        run.python = sys.executable  # the agent on the ordinary disk
        run.start_agents(cluster, 4, 1)
        disk = Path(f"/proc/{run.scheduler.pid}/root") / str(mnt).lstrip("/")
        journal, filler = disk / "journal.db", disk / "filler"
        host, mport = run.scheduler.info["host"], run.scheduler.info["metrics"]
        with run.client() as client:
            client.wait_ready()
            wait_until(lambda: client.cluster_state().clock.started, 30, "clock started")
            acked = [client.submit(num_gpus=1, duration_s=60.0, job_id=f"before-{i}").job_id for i in range(5)]
            _fill(filler)
            refused: list[grpc.RpcError] = []

            def submit_until_refused() -> bool:
                try:
                    acked.append(client.submit(num_gpus=1, duration_s=60.0, job_id=f"full-{len(acked)}").job_id)
                except grpc.RpcError as e:
                    refused.append(e)
                    return True
                return False

            # The WAL reuses what it already has for a while: submit until the disk says no.
            wait_until(submit_until_refused, 60, "a submission refused by the full disk", poll_s=0)
            e = refused[0]
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.code(), e.details())
            assert refusal_of(e)["code"] == "journal_disk_full"
            assert "sqlite3" not in e.details() and "disk full" in e.details()
            lost_id = f"full-{len(acked)}"
            # Refused means not there at all: not PENDING, and the same id is refused again, not
            # ALREADY_EXISTS.
            with pytest.raises(grpc.RpcError) as nf:
                client.get_job(lost_id)
            assert nf.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.RpcError) as again:
                client.submit(num_gpus=1, duration_s=60.0, job_id=lost_id)
            assert again.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # Reads go on; the scheduler says it is not ready, and why.
            assert client.list_jobs(limit=1000).total == len(acked)
            code, why = _ready(host, mport)
            assert code == 503 and "disk full" in why, (code, why)
            assert sample_sum(scrape(host, mport)["analysim_journal_writable"], "analysim_journal_writable") == 0
            assert run.scheduler.alive()
            filler.unlink()  # space is back
            acked.append(client.submit(num_gpus=1, duration_s=60.0, job_id=lost_id).job_id)
            wait_until(lambda: _ready(host, mport)[0] == 200, 30, "ready again")
            for job_id in acked:
                wait_until(lambda j=job_id: client.get_job(j).status == spb.JOB_STATUS_COMPLETED, 60, f"{job_id} done")
            wait_until(lambda: (j := _journalled(journal, tmp_path / "copy")) and all(j.get(i) == "completed" for i in acked), 30,
                       "every acknowledged job journalled as completed")
        assert run.scheduler.alive()
    finally:
        run.stop()
    assert "Traceback" not in run.scheduler.log.read_text(), run.scheduler.tail(40)


def _journalled(path: Path, copy: Path) -> dict[str, str]:
    """What the journal holds, read from a copy (SQLite resolves /proc/PID/root to our own root)."""
    copy.mkdir(exist_ok=True)
    for suffix in ("", "-wal"):
        src = path.with_name(path.name + suffix)
        if src.exists():
            shutil.copyfile(src, copy / f"journal.db{suffix}")
    with closing(sqlite3.connect(copy / "journal.db")) as db:
        return dict(db.execute("SELECT job_id, status FROM jobs"))


# Run in the small tmpfs's namespace: a journal with acknowledged client jobs, the disk filled,
# the scheduler started on it (plain and accepting a loss), then space freed and the journal read.
_FULL_AT_START = r"""
import json, subprocess, sys
from pathlib import Path
from analysim.core.job import JobSpec
from scheduler_svc.journal import Journal
from tests.polling import scaled
from tests.test_live_disk_full import _fill

mnt = Path(sys.argv[1])
path = mnt / "journal.db"
j = Journal(path)
for i in range(5):
    j.add_client_job(JobSpec(f"acked-{i}", 0.0, 60.0, 1))
j.close()
_fill(mnt / "filler")
starts = []
for extra in ([], ["--accept-journal-loss"]):
    r = subprocess.run([sys.executable, "-m", "scheduler_svc", "serve", "--jobs", "0", "--cluster", "4x8",
                        "--journal", str(path), "--port", "0", *extra], capture_output=True, text=True, timeout=scaled(60))
    starts.append([r.returncode, r.stderr])
# --out on the full disk (the journal elsewhere): refused at start, not at the replay's end.
r = subprocess.run([sys.executable, "-m", "scheduler_svc", "serve", "--jobs", "0", "--cluster", "4x8",
                    "--journal", sys.argv[2], "--out", str(mnt / "out"), "--port", "0"],
                   capture_output=True, text=True, timeout=scaled(60))
out_start = [r.returncode, r.stderr]
(mnt / "filler").unlink()
print(json.dumps({"starts": starts, "out": out_start, "jobs": [row[0] for row in Journal(path).jobs()]}))
"""


def test_a_full_disk_at_start_is_reported_as_a_full_disk(tmp_path: Path) -> None:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if not _namespaces_work(mnt):
        pytest.skip("unshare cannot mount a tmpfs here (no unprivileged user namespaces)")
    r = subprocess.run([str(_wrapper(tmp_path, mnt)), "-c", _FULL_AT_START, str(mnt), str(tmp_path / "other.db")],
                       cwd=ROOT, capture_output=True, text=True, timeout=scaled(180))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for code, err in out["starts"]:
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "the disk is full" in err and "accept" not in err and "damaged" not in err, err
    assert out["jobs"] == [f"acked-{i}" for i in range(5)]  # space back: all there, nothing lost
    code, err = out["out"]
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"--out {mnt / 'out'}: the disk is full" in err, err
