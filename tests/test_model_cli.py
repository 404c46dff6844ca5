"""``analysim model`` and ``analysim gateway`` as real processes: train, list, show, serve;
errors are one line on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mlaas_monitor.store import Store
from tests.polling import scaled
from tests.procs import started
from tests.shared import needs_shared
from tests.test_gateway_helpers import (
    ADMIN_KEY,
    GERMAN,
    ROOT,
    Client,
    credit_csv,
    iris_model,
    wait_until,
)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlaas_monitor", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=env if env is not None else {k: v for k, v in os.environ.items() if k != "ANALYSIM_ADMIN_KEY"},
    )  # fmt: skip


def test_train_list_show(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    r = run("model", "train", "--db", db, "--dataset", str(credit_csv()), "--max-leaf-nodes", "3", "--name", "credit",
            "--reveal-leaf", "--price", "0.01")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("model credit: 3 leaves")
    r = run("model", "list", "--db", db)
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[:5] == ["credit", Path(credit_csv()).name, "4", "2", "3"]
    r = run("model", "show", "--db", db, "credit")
    shown = json.loads(r.stdout)
    assert shown["policy"] == {"reveal_confidence": True, "confidence_decimals": 2, "reveal_leaf": True, "price": 0.01,
                              "top_k": 1, "confidence_noise": 0.0, "noise_seed": 0}
    assert "tree" not in shown


@needs_shared(GERMAN)
def test_train_german_from_shared(tmp_path: Path) -> None:
    r = run("model", "train", "--db", str(tmp_path / "s.db"), "--dataset", str(GERMAN), "--max-leaf-nodes", "26", "--name", "german")
    assert r.returncode == 0 and "26 leaves" in r.stdout and "20 features" in r.stdout


@pytest.fixture(scope="module")
def store_with_m(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding model "m" (trained in-process: a subprocess would pay for importing
    scikit-learn again), next to a file that is not SQLite."""
    db = tmp_path_factory.mktemp("cli") / "s.db"
    store = Store(db)
    store.add_model(iris_model("m"))
    store.close()
    (db.parent / "garbage.db").write_bytes(b"this is not sqlite" * 100)
    return db


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["model", "show", "--db", "{db}", "nope"], "no model 'nope'"),
        (["model", "list", "--db", "{tmp}/missing.db"], "no store at"),
        (["model", "train", "--db", "{db}", "--dataset", "nope", "--name", "x"], "neither a built-in"),
        (["model", "train", "--db", "{db}", "--dataset", "iris", "--name", "bad name"], "--name"),
        (["model", "train", "--db", "{db}", "--dataset", "iris", "--name", "x", "--decimals", "40"], "--confidence-decimals"),
        (["model", "train", "--db", "{db}", "--dataset", "iris", "--name", "x", "--top-k", "0"], "--top-k"),
        (["model", "train", "--db", "{db}", "--dataset", "iris", "--name", "x", "--confidence-noise", "3"], "--confidence-noise"),
        (["model", "train", "--db", "{db}", "--dataset", "iris", "--name", "m"], "already exists"),
        (["model", "list", "--db", "{tmp}/garbage.db"], "not a usable store"),
        (["gateway", "--db", "{db}"], "no admin key"),
    ],
)
def test_errors_are_one_line_without_traceback(store_with_m: Path, args: list[str], message: str) -> None:
    tmp = store_with_m.parent
    r = run(*[a.format(db=store_with_m, tmp=tmp) for a in args])
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert message in r.stderr


def test_short_admin_key_is_refused(tmp_path: Path) -> None:
    keyfile = tmp_path / "k"
    keyfile.write_text("short\n")
    r = run("gateway", "--db", str(tmp_path / "s.db"), "--admin-key-file", str(keyfile))
    assert r.returncode == 2 and "shorter than" in r.stderr


def test_analysim_gateway_serves_models_trained_while_running(tmp_path: Path) -> None:
    db, ports = tmp_path / "s.db", tmp_path / "ports.json"
    keyfile = tmp_path / "admin.key"
    keyfile.write_text(ADMIN_KEY + "\n")
    proc = started(subprocess.Popen(
                [sys.executable, "-m", "analysim", "gateway", "--db", str(db), "--port", "0", "--grpc-port", "0",
                 "--admin-key-file", str(keyfile), "--port-file", str(ports)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ))  # fmt: skip
    try:
        wait_until(lambda: ports.exists() or proc.poll() is not None, what="the port file")
        assert proc.poll() is None, proc.communicate()
        port = json.loads(ports.read_text())["http"]
        admin = Client("127.0.0.1", port, ADMIN_KEY)
        assert admin.get("/v1/admin/users") == (200, {"users": []})
        # Registered by another process while the gateway runs.
        assert run("model", "train", "--db", str(db), "--dataset", "iris", "--name", "late").returncode == 0
        key = admin.post("/v1/admin/users", {"name": "u"})[1]["api_key"]
        status, body = Client("127.0.0.1", port, key).post("/v1/models/late/predict", {"rows": [[5.1, 3.5, 1.4, 0.2]]})
        assert status == 200 and body["predictions"][0]["label"] == 0
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=scaled(30))
    assert proc.returncode == 0, err
    assert out.startswith("gateway (monitored): http://127.0.0.1:")
