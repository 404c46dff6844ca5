"""A throwaway PostgreSQL cluster for tests: initdb into a temporary directory, postgres on a
unix socket there (no TCP port to collide on), stopped and deleted at the end.

PostgreSQL refuses to run as root; CI runs the tests as root, so the server then runs as the
``postgres`` system user (Debian's package creates it) or ``nobody``. Debian keeps initdb and
pg_ctl under /usr/lib/postgresql/VERSION/bin, off PATH.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


class PostgresUnavailable(Exception):
    """This machine cannot run a throwaway PostgreSQL (the tests that need one skip)."""


def pg_bin() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if not versions:
        raise PostgresUnavailable("PostgreSQL is not installed (no pg_ctl on PATH or in /usr/lib/postgresql)")
    return Path(versions[-1]).parent


def _server_user() -> pwd.struct_passwd | None:
    """Whom to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailable("running as root and there is no 'postgres' or 'nobody' user to run PostgreSQL as")


class PgCluster:
    """One cluster: ``start``, ``stop`` (as ``pg_ctl stop -m MODE``), ``new_database``, ``remove``."""

    _names = itertools.count()

    def __init__(self, durable: bool = False) -> None:
        """``durable``: PostgreSQL's default fsync behaviour (benchmarks); else fsync off (tests)."""
        self.durable = durable
        self.bin = pg_bin()
        self.user = _server_user()
        # Short: a unix socket's path must fit in 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="analysim-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        kw = {} if self.user is None else {"user": self.user.pw_uid, "group": self.user.pw_gid}
        r = subprocess.run([str(self.bin / tool), *args], capture_output=True, text=True, cwd=self.root, **kw)
        if r.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(f"{tool} failed ({r.returncode}): {r.stderr.strip()[-2000:]} {log}")

    def start(self) -> PgCluster:
        # fsync off: a test cluster lives for one session; a clean stop still writes everything
        # (the restart drill stops with -m fast, which checkpoints).
        opts = f"-k {self.root} -c listen_addresses='' -p 5432 -c max_connections=200"
        if not self.durable:  # and small: several run at once under xdist
            opts += " -c fsync=off -c full_page_writes=off -c shared_buffers=16MB"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", opts, "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.root}&port=5432"

    def new_database(self) -> str:
        """A fresh, empty database's URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as con:
            con.execute(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.url(name)

    def remove(self) -> None:
        with contextlib.suppress(PostgresUnavailable):  # not running
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def throwaway_cluster(**kw: bool) -> Iterator[PgCluster]:
    """A started cluster, removed afterwards; the test is skipped where none can start."""
    import pytest

    try:
        cluster = PgCluster(**kw).start()
    except PostgresUnavailable as e:
        pytest.skip(f"no PostgreSQL: {e}")
    try:
        yield cluster
    finally:
        cluster.remove()
