"""Shared helpers for the gateway and model tests: real models, a real gateway on
127.0.0.1 ephemeral ports, a plain HTTP client, and polling with a deadline."""

from __future__ import annotations

import atexit
import functools
import http.client
import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mlaas_monitor.datasets import load_dataset
from mlaas_monitor.model import Model, Policy
from mlaas_monitor.schema import NUMERIC
from mlaas_monitor.server import Extension, GatewayThread
from mlaas_monitor.service import Gateway, Limits
from mlaas_monitor.store import Store
from mlaas_monitor.training import train_model
from tests.polling import scaled, wait_until
from tests.procs import started
from tests.shared import DATASETS

ROOT = Path(__file__).resolve().parent.parent
GERMAN = DATASETS / "german.data"
ADULT = DATASETS / "adult.csv"
ADMIN_KEY = "test-admin-key-0123456789"


# A small mixed-type dataset made here, so the core tests run without ../shared.
CREDIT_CSV = "amount,purpose,age,housing,risk\n" + "\n".join(
    f"{100 + (i * 37) % 900},{['car', 'tv', 'repairs', 'education'][i % 4]},{18 + (i * 7) % 50},"
    f"{['own', 'rent', 'free'][(i // 3) % 3]},{'bad' if ((i * 37) % 900 > 500) != (i % 4 == 1) else 'good'}"
    for i in range(240)
)


@functools.cache
def credit_csv(tmp_root: str = "/tmp") -> Path:
    """The dataset as a file, one per test process, removed when that process exits (not when
    a forked child of it does)."""
    pid = os.getpid()
    path = Path(tmp_root) / f"analysim-credit-{pid}.csv"
    path.write_text(CREDIT_CSV + "\n")
    atexit.register(lambda: os.getpid() == pid and path.unlink(missing_ok=True))
    return path


@functools.cache
def credit_model(name: str = "credit") -> Model:
    return train_model(load_dataset(str(credit_csv())), name, max_leaf_nodes=12, seed=0)


@functools.cache
def iris_model(name: str = "iris") -> Model:
    return train_model(load_dataset("iris"), name, max_depth=4, seed=0)


def typed_rows(model: Model, raw: list[list[str]]) -> list[list[Any]]:
    """Raw text rows as a client would send them: numbers for numeric features."""
    kinds = [f.kind for f in model.schema.features]
    return [[float(v) if k == NUMERIC else v for v, k in zip(r, kinds, strict=True)] for r in raw]


@functools.cache
def credit_rows() -> list[list[Any]]:
    return typed_rows(credit_model(), load_dataset(str(credit_csv())).data)  # type: ignore[arg-type]


def start_module(
    args: list[str], port_file: Path, what: str, stdout: int = subprocess.DEVNULL
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Run ``python -m ARGS --port-file PORT_FILE`` (the test admin key in its environment)
    and return it with the ports it wrote, once it listens. stderr is piped, so a process
    that dies while starting fails the test with its message; it (and what it starts) is
    killed when the test ends, however it ends."""
    port_file.unlink(missing_ok=True)
    proc = started(subprocess.Popen(
        [sys.executable, "-m", *args, "--port-file", str(port_file)],
        cwd=ROOT, env={**os.environ, "ANALYSIM_ADMIN_KEY": ADMIN_KEY},
        stdout=stdout, stderr=subprocess.PIPE, text=True,
    ))  # fmt: skip

    def ready() -> bool:
        assert proc.poll() is None, proc.communicate()
        return port_file.exists()

    wait_until(ready, what=what)
    return proc, json.loads(port_file.read_text())


class Client:
    """Minimal HTTP/1.1 client: one keep-alive connection, reconnecting after errors and, as
    HTTP clients do, when the server has closed it while idle (its idle timeout)."""

    def __init__(self, host: str, port: int, key: str | None = None) -> None:
        self.host, self.port, self.key = host, port, key
        self._conn: http.client.HTTPConnection | None = None
        self.last_headers: http.client.HTTPMessage | None = None  # of the last response

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        key: str | None | bool = True,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json", **(headers or {})}
        k = self.key if key is True else key
        if k:
            headers["Authorization"] = f"Bearer {k}"
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if self._conn is not None and self._conn.sock is not None and select.select([self._conn.sock], [], [], 0)[0]:
            self.close()  # readable while no request is out: the server closed it
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=scaled(30))
        try:
            self._conn.request(method, path, body=data, headers=headers)
            resp = self._conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        self.last_headers = resp.headers
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        ctype = resp.getheader("Content-Type", "")
        return resp.status, json.loads(payload) if "json" in ctype else payload.decode()

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.request("POST", path, body, **kw)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Running:
    def __init__(self, thread: GatewayThread, store: Store) -> None:
        self.thread, self.store, self.gw = thread, store, thread.gw
        assert thread.bound is not None
        self.port = thread.bound.http_port
        self.admin = Client("127.0.0.1", self.port, ADMIN_KEY)

    def client(self, key: str | None = None) -> Client:
        return Client("127.0.0.1", self.port, key)

    def new_user(self, name: str, **limits: Any) -> Client:
        status, body = self.admin.post("/v1/admin/users", {"name": name, **limits})
        assert status == 200, body
        return self.client(body["api_key"])

    def new_key(self, name: str) -> str:
        key = self.new_user(name).key
        assert key is not None
        return key

    def charged(self) -> tuple[int, int, int]:
        return self.store.ledger_totals()


@contextmanager
def running_gateway(
    db: Path | str, models: list[Model] | None = None, limits: Limits | None = None, policies: dict[str, Policy] | None = None,
    extensions: Sequence[Extension] = (),
) -> Iterator[Running]:
    store = Store(db, background_checkpoint=True)
    for m in models if models is not None else [credit_model()]:
        if m.id not in store.model_ids():
            store.add_model(m)
    for mid, p in (policies or {}).items():
        store.set_policy(mid, p)
    thread = GatewayThread(Gateway(store, ADMIN_KEY, limits or Limits()), extensions=extensions).start()
    try:
        yield Running(thread, store)
    finally:
        thread.stop()
        store.close()


def test_helpers_wait_until_times_out() -> None:
    with pytest.raises(AssertionError, match="timed out"):
        wait_until(lambda: False, deadline_s=0.05)
