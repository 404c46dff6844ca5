"""Gateway faults that must fail safe, against real processes and real files: a store that
lost a table is refused at start (never re-created empty and billed into)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from mlaas_monitor.store import Store
from tests.test_gateway_helpers import ADMIN_KEY, ROOT, credit_rows, running_gateway


def _tables(db: Path) -> set[str]:
    with closing(sqlite3.connect(db)) as c:
        return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_store_missing_its_ledger_is_refused_not_recreated(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with running_gateway(db) as g:
        alice = g.new_user("alice")
        assert alice.post("/v1/models/credit/predict", {"rows": credit_rows()[:5]})[0] == 200
    with closing(sqlite3.connect(db)) as c:
        c.execute("DROP TABLE ledger")
        c.commit()
    p = subprocess.run([sys.executable, "-m", "mlaas_monitor.monitor", "gateway", "--db", str(db), "--port", "0",
                        "--grpc-port", "0"], cwd=ROOT, env={"ANALYSIM_ADMIN_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert "ledger table is missing" in p.stderr and "restore the store" in p.stderr, p.stderr
    assert "ledger" not in _tables(db)  # left as it was


def test_a_new_store_is_created_whole(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    Store(db).close()
    assert {"meta", "models", "users", "query_log", "ledger", "sequences"} <= _tables(db)
