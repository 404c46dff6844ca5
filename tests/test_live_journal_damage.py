"""A damaged journal is refused, never resumed in silence: a journal written by a real replay
(the scheduler SIGKILLed, its WAL left behind), then truncated mid-page, with bytes flipped in
its pages, with random bytes in its WAL, or emptied. Each start is one line and exit 2;
``--accept-journal-loss`` resumes and logs what was lost. The undamaged copy resumes."""

from __future__ import annotations

import json
import random
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from scheduler_svc.launcher import ROOT
from tests.polling import scaled
from tests.procs import started
from tests.test_live_helpers import live, wait_until

ARGS = ["--jobs", "150", "--seed", "6", "--cluster", "8x8"]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A journal as a SIGKILLed scheduler leaves it: most of it in the WAL."""
    tmp = tmp_path_factory.mktemp("journal")
    journal = tmp / "journal.db"
    with live(tmp, [*ARGS[:4], "--journal", str(journal)], "8x8", 8, agents=1) as (run, client):
        client.wait_done(120)
        run.kill(run.scheduler, signal.SIGKILL)
    assert Path(f"{journal}-wal").stat().st_size > 0
    return journal


def _copy(journal: Path, to: Path, wal: bool = True) -> Path:
    """The journal's files: the database, its WAL, its acknowledgement record."""
    to.mkdir()
    shutil.copyfile(journal, to / "journal.db")
    shutil.copyfile(f"{journal}-acks", to / "journal.db-acks")
    if wal:
        shutil.copyfile(f"{journal}-wal", to / "journal.db-wal")
    return to / "journal.db"


def _checkpointed(journal: Path, to: Path) -> Path:
    """The same journal with its WAL folded into the file (so that the file holds it all)."""
    copy = _copy(journal, to)
    with closing(sqlite3.connect(copy)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return copy


def _start(journal: Path, *extra: str) -> subprocess.Popen[str]:
    port_file = journal.parent / "port.json"
    return started(subprocess.Popen([sys.executable, "-m", "scheduler_svc", "serve", *ARGS, "--journal", str(journal),
                                     "--log-level", "WARNING", "--port-file", str(port_file), *extra], cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip


def _refused(journal: Path) -> str:
    p = _start(journal)
    try:
        out, err = p.communicate(timeout=scaled(60))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 2, (p.returncode, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "is damaged" in err and str(journal) in err, err
    return err


def _serves(journal: Path, *extra: str) -> str:
    """Starts (and waits for agents): its log (stdout and stderr); then stopped."""
    p = _start(journal, *extra)
    port_file = journal.parent / "port.json"
    try:
        wait_until(lambda: port_file.exists() or p.poll() is not None, 60, "the scheduler listening")
        assert p.poll() is None, p.communicate()
        assert json.loads(port_file.read_text())["grpc"] > 0
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=scaled(30))
    assert "Traceback" not in out + err, out + err
    return out + err


def test_undamaged_copy_resumes(written: Path, tmp_path: Path) -> None:
    _serves(_copy(written, tmp_path / "ok"))


def test_truncated_mid_page_is_refused(written: Path, tmp_path: Path) -> None:
    copy = _checkpointed(written, tmp_path / "cut")
    size = copy.stat().st_size
    assert size > 3 * 4096
    with copy.open("r+b") as f:
        f.truncate(size - 4096 - 1000)
    _refused(copy)


def test_flipped_bytes_are_refused(written: Path, tmp_path: Path) -> None:
    copy = _checkpointed(written, tmp_path / "flip")
    data = bytearray(copy.read_bytes())
    pages = len(data) // 4096
    rng = random.Random(1)
    # 200 bytes of b-tree page headers (the first bytes of pages after the first).
    for _ in range(200):
        i = rng.randrange(1, pages) * 4096 + rng.randrange(0, 8)
        data[i] ^= 0xFF
    copy.write_bytes(bytes(data))
    _refused(copy)


def _frames_used(journal: Path, scratch: Path) -> int:
    copy = _copy(journal, scratch)
    with closing(sqlite3.connect(copy)) as db:
        return db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]


def test_random_bytes_in_the_wal_are_refused_unless_the_loss_is_accepted(written: Path, tmp_path: Path) -> None:
    used = _frames_used(written, tmp_path / "scratch")
    assert used >= 8
    copy = _copy(written, tmp_path / "wal")
    wal = Path(f"{copy}-wal")
    data = bytearray(wal.read_bytes())
    page = struct.unpack(">I", data[8:12])[0]
    at = 32 + (used // 2) * (24 + page) + 24 + 100  # inside the page of a frame in the middle
    data[at:at + 512] = random.Random(2).randbytes(512)
    wal.write_bytes(bytes(data))
    err = _refused(copy)
    assert "WAL" in err and "committed transaction" in err
    log = _serves(copy, "--accept-journal-loss")
    assert "--accept-journal-loss" in log and "resuming from what it still holds" in log and "ended" in log, log


def test_empty_journal_is_refused(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    empty = tmp_path / "e" / "journal.db"
    empty.write_bytes(b"")
    err = _refused(empty)
    assert "empty" in err


CLIENT_JOBS = 10


@pytest.fixture(scope="module")
def acked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A journal with CLIENT_JOBS acknowledged client jobs (all ended) as a SIGKILLed scheduler
    leaves it, with the ids of those jobs."""
    tmp = tmp_path_factory.mktemp("acked")
    journal = tmp / "journal.db"
    with live(tmp, [*ARGS[:4], "--journal", str(journal)], "8x8", 8, agents=1) as (run, client):
        ids = [client.submit(num_gpus=1, duration_s=30.0).job_id for _ in range(CLIENT_JOBS)]
        client.wait_done(120)
        run.kill(run.scheduler, signal.SIGKILL)
    assert Path(f"{journal}-wal").stat().st_size > 0
    return journal, ids


def _copy_all(journal: Path, to: Path) -> Path:
    """The journal's files as the killed scheduler left them, its -shm too."""
    copy = _copy(journal, to)
    if Path(f"{journal}-shm").exists():
        shutil.copyfile(f"{journal}-shm", to / "journal.db-shm")
    return copy


def _lost_in_log(log: str) -> set[str]:
    line = next(x for x in log.splitlines() if "--accept-journal-loss" in x and "acknowledged client job" in x)
    return set(line.split("acknowledged client job(s): ", 1)[1].split(", "))


@pytest.mark.parametrize("cut", ["mid-frame", "header", "emptied", "missing"])
def test_a_cut_wal_is_refused_naming_the_acknowledged_jobs_it_loses(acked: tuple[Path, list[str]], tmp_path: Path,
                                                                      cut: str) -> None:
    journal, ids = acked
    copy = _copy_all(journal, tmp_path / "cut")
    wal = Path(f"{copy}-wal")
    page = struct.unpack(">I", wal.read_bytes()[8:12])[0]
    if cut == "missing":
        wal.unlink()
    else:
        with wal.open("r+b") as f:
            f.truncate({"mid-frame": 32 + 3 * (24 + page) + 100, "header": 32, "emptied": 0}[cut])
    err = _refused(copy)
    assert "transactions it committed" in err and "acknowledged client job(s)" in err, err
    if cut != "mid-frame":  # nothing of the run reached the file: every acknowledged job would be lost
        assert f"{CLIENT_JOBS} acknowledged client job(s) ({ids[0]}, " in err, err
    log = _serves(copy, "--accept-journal-loss")
    lost = _lost_in_log(log)
    assert lost <= set(ids) and (lost == set(ids) or cut == "mid-frame"), log
    assert lost, log


def _edited(journal: Path, to: Path, *sql: str) -> Path:
    copy = _copy(journal, to)
    with closing(sqlite3.connect(copy)) as db:
        for statement in sql:
            db.execute(statement)
        db.commit()
    return copy


@pytest.mark.parametrize(("sql", "says"), [
    (["DROP TABLE jobs"], "its table jobs is missing"),
    (["ALTER TABLE jobs RENAME COLUMN record TO rec"], "its table jobs has columns"),
    (["UPDATE jobs SET status = 'pending' WHERE job_id = (SELECT MIN(job_id) FROM jobs WHERE source = 'client')"],
     "its status is 'pending' with an end record"),
    (["UPDATE jobs SET status = 'done' WHERE job_id = (SELECT MIN(job_id) FROM jobs WHERE source = 'client')"],
     "its status is 'done'"),
    (["UPDATE meta SET value = 'NaN' WHERE key = 'clock'"], "meta clock is nan"),
    (["UPDATE meta SET value = 'Infinity' WHERE key = 'clock'"], "meta clock is inf"),
    (["UPDATE jobs SET spec = replace(spec, '\"num_gpus\"', '\"gpus\"') WHERE source = 'client'"],
     "unknown field(s) 'gpus'"),
    (["DELETE FROM jobs WHERE source = 'client'"], f"{CLIENT_JOBS} acknowledged client job(s) are missing"),
], ids=["dropped-table", "renamed-column", "ended-as-pending", "unknown-status", "nan-clock", "inf-clock",
        "unknown-spec-key", "deleted-rows"])
def test_records_no_scheduler_writes_are_refused(acked: tuple[Path, list[str]], tmp_path: Path, sql: list[str],
                                                 says: str) -> None:
    journal, ids = acked
    copy = _edited(journal, tmp_path / "edit", *sql)
    err = _refused(copy)
    assert says in err, err
    # What resuming would lose, by name: the acknowledged client jobs without a good row (a bad
    # clock loses no job; a bad row, that job; a table lost or every spec renamed, all of them).
    lost = 0 if "clock" in says else 1 if "status" in says else CLIENT_JOBS
    if lost == 0:
        assert "resuming would lose no acknowledged client job" in err, err
    else:
        assert sorted(ids)[0] == ids[0]
        assert f"resuming would lose {lost} acknowledged client job(s) ({ids[0]}" in err, err


def test_a_dropped_table_accepted_logs_every_lost_job(acked: tuple[Path, list[str]], tmp_path: Path) -> None:
    journal, ids = acked
    copy = _edited(journal, tmp_path / "drop", "DROP TABLE jobs")
    assert _lost_in_log(_serves(copy, "--accept-journal-loss")) == set(ids)


def test_a_wal_that_is_a_directory_is_one_line(acked: tuple[Path, list[str]], tmp_path: Path) -> None:
    journal, _ = acked
    copy = _copy(journal, tmp_path / "dir", wal=False)
    Path(f"{copy}-wal").mkdir()
    for extra in ((), ("--accept-journal-loss",)):
        p = _start(copy, *extra)
        _, err = p.communicate(timeout=scaled(60))
        assert p.returncode == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "is not a regular file" in err, err


def test_a_journal_removed_without_its_record_is_refused(acked: tuple[Path, list[str]], tmp_path: Path) -> None:
    journal, ids = acked
    copy = _copy(journal, tmp_path / "gone")
    for suffix in ("", "-wal"):
        Path(f"{copy}{suffix}").unlink()
    err = _refused(copy)
    assert "the file is missing, but its acknowledgement record" in err, err
    assert f"{CLIENT_JOBS} acknowledged client job(s)" in err, err
    assert not copy.exists()  # left as it was
