"""The stack's traffic: jobs injected into the scheduler over gRPC at a rate, and a mix of
gateway clients — benign users, solo attackers (pathfinding, random) and a colluding group —
so that the cluster and extraction dashboards show something real. What ``analysim load``
runs. A client of the services, like the CLI: nothing here is imported by a service.

Every client is a thread with its own pace; the attackers are the attack suite of
``mlaas_monitor.monitor.attacks`` (paced through the oracle's per-request hook), run again
with a new seed whenever one finishes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from analysim.errors import UserError
from analysim.tls import TlsFiles

log = logging.getLogger("analysim.load")
GPU_CHOICES = (1, 1, 1, 1, 2, 2, 4, 8)  # mostly single-GPU jobs, as in the Philly trace
RETRY_S = 2.0


class _Stopped(Exception):
    """Raised from a pacing hook to end an attack run when the load stops."""


class Pacer:
    """At most ``rate`` events per second (None: unpaced); ``wait`` raises _Stopped once
    ``stop`` is set."""

    def __init__(self, rate: float | None, stop: threading.Event) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.stop = stop
        self.next = time.monotonic()

    def wait(self) -> None:
        self.next = max(self.next + self.interval, time.monotonic())
        if self.stop.wait(max(0.0, self.next - time.monotonic())):
            raise _Stopped


@dataclass
class Counts:
    sent: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, who: str, sent: int = 0, errors: int = 0) -> None:
        with self.lock:
            self.sent[who] = self.sent.get(who, 0) + sent
            self.errors[who] = self.errors.get(who, 0) + errors


# ---- jobs into the scheduler ----


def inject_jobs(target: str, rate: float, vcs: Sequence[str], seed: int, stop: threading.Event, counts: Counts,
                connect_timeout_s: float = 120.0, token: str | None = None, tls: TlsFiles | None = None) -> None:
    """Poisson arrivals at ``rate`` jobs per wall second: 1-8 GPUs, log-normal run times
    (minutes to a day of virtual time), VCs drawn uniformly; ``token``: a client's, when the
    scheduler requires one."""
    import grpc

    from scheduler_svc.client import SchedulerClient

    rng = np.random.default_rng(seed)
    with SchedulerClient(target, token=token, tls=tls) as client:
        try:
            client.wait_ready(connect_timeout_s)
        except TimeoutError as e:
            raise UserError(str(e)) from None
        log.info("injecting jobs into %s at %g/s", target, rate)
        while not stop.wait(rng.exponential(1.0 / rate)):
            gpus = int(rng.choice(GPU_CHOICES))
            duration = float(np.clip(rng.lognormal(np.log(3600), 1.2), 60, 86400))
            vc = str(rng.choice(vcs)) if vcs else ""
            try:
                client.submit(gpus, duration, vc=vc, user="load")
                counts.add("jobs", sent=1)
            except grpc.RpcError as e:
                counts.add("jobs", errors=1)
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    raise UserError(f"{target}: SubmitJob refused: {e.code().name}: {e.details()} "
                                    "(give --token-file, a client token)") from None
                log.warning("SubmitJob: %s: %s", e.code().name, e.details())
                stop.wait(RETRY_S)


# ---- the gateway ----


@dataclass(frozen=True)
class Mix:
    benign: int = 3
    attackers: tuple[str, ...] = ("pathfinding", "random")
    colluders: int = 3
    collude_base: str = "pathfinding"
    group: str = "ring"
    quota_rows: int | None = None
    enforce: str = "none"  # the model's enforcement action: none, degrade, refuse
    enforce_threshold: float = 0.9


def user_names(mix: Mix) -> dict[str, list[str]]:
    """Client -> the accounts it uses."""
    out = {f"benign-{i}": [f"benign-{i}"] for i in range(mix.benign)}
    out.update({f"attacker-{s}": [f"attacker-{s}"] for s in mix.attackers})
    if mix.colluders:
        out[f"group-{mix.group}"] = [f"{mix.group}-{i}" for i in range(mix.colluders)]
    return out


def provision(admin, mix: Mix, model: str) -> dict[str, str]:  # noqa: ANN001 — an attacks.ApiClient (admin key)
    """Create the accounts (or give existing ones a new key), declare the group, set the
    model's enforcement; user -> key."""
    admin.call("PUT", f"/v1/admin/monitor/{model}/config", {"enforcement": {
        "action": mix.enforce, "method": "coverage_mass", "threshold": mix.enforce_threshold}})  # fmt: skip
    clients = user_names(mix)
    existing = {u["user"] for u in admin.call("GET", "/v1/admin/users")["users"]}
    keys: dict[str, str] = {}
    for name in (u for us in clients.values() for u in us):
        if name in existing:
            keys[name] = admin.call("POST", f"/v1/admin/users/{name}/rotate")["api_key"]
        else:
            keys[name] = admin.call("POST", "/v1/admin/users", {"name": name})["api_key"]
        if mix.quota_rows is not None:
            admin.call("PATCH", f"/v1/admin/users/{name}", {"quota_rows": mix.quota_rows})
    if mix.colluders:
        groups = {g["name"] for g in admin.call("GET", "/v1/admin/groups")["groups"]}
        if mix.group not in groups:
            admin.call("POST", "/v1/admin/groups", {"name": mix.group, "members": clients[f"group-{mix.group}"]})
    return keys


def wait_for_gateway(url: str, admin_key: str, model: str, stop: threading.Event, deadline_s: float):  # noqa: ANN201
    """The admin client once the gateway answers and serves ``model``."""
    from mlaas_monitor.monitor.attacks import ApiClient

    admin = ApiClient(url, admin_key)
    end = time.monotonic() + deadline_s
    while True:
        try:
            admin.call("GET", f"/v1/models/{model}")
            return admin
        except UserError as e:
            if time.monotonic() > end or stop.is_set():
                raise UserError(f"gateway {url} not ready after {deadline_s:g} s: {e}") from None
            stop.wait(0.5)


def benign_client(url: str, key: str, model: str, rows: np.ndarray, rate: float | None, seed: int,
                  stop: threading.Event, counts: Counts, who: str) -> None:
    """A user asking about real rows of the dataset, one to three per request."""
    from mlaas_monitor.monitor.attacks import ApiClient, Domain

    client = ApiClient(url, key)
    domain = Domain.from_public(client.call("GET", f"/v1/models/{model}")["features"])
    rng = np.random.default_rng(seed)
    pacer = Pacer(rate, stop)
    try:
        while True:
            pacer.wait()
            batch = rows[rng.integers(0, rows.shape[0], size=int(rng.integers(1, 4)))]
            try:
                client.call("POST", f"/v1/models/{model}/predict", {"rows": [domain.raw(x) for x in batch]})
                counts.add(who, sent=len(batch))
            except UserError as e:
                counts.add(who, errors=1)
                log.warning("%s: %s", who, e)
                stop.wait(RETRY_S)
    except _Stopped:
        pass
    finally:
        client.close()


def attack_client(url: str, keys: Sequence[str], model: str, strategy: str, rate: float | None, seed: int,
                  stop: threading.Event, counts: Counts, who: str) -> None:
    """One attack of ``strategy`` over ``keys`` (several keys: colluding), paced at ``rate``
    requests per second, again with the next seed each time it finishes."""
    from mlaas_monitor.monitor.attacks import Oracle, run_strategy

    pacer = Pacer(rate, stop)
    run = 0
    while not stop.is_set():
        oracle: Oracle | None = None
        try:
            oracle = Oracle.connect(url, keys, model, None)
            oracle.on_request = _counting(pacer, counts, who)
            run_strategy(strategy, oracle, seed + run)
            log.info("%s: %s run %d done after %d queries", who, strategy, run, oracle.queries)
        except _Stopped:
            return
        except UserError as e:  # refused (enforcement, quota) or unreachable: back off, try again
            counts.add(who, errors=1)
            log.warning("%s: %s", who, e)
            stop.wait(RETRY_S)
        finally:
            if oracle is not None:
                oracle.close()
        run += 1


def _counting(pacer: Pacer, counts: Counts, who: str) -> Callable[[object], None]:
    """The oracle's per-request hook: count the rows it sent, then wait for the next slot."""
    seen = 0

    def hook(oracle) -> None:  # noqa: ANN001 — an attacks.Oracle
        nonlocal seen
        counts.add(who, sent=oracle.queries - seen)
        seen = oracle.queries
        pacer.wait()

    return hook


def _start_gateway_clients(start: Callable[..., None], gateway: str, admin_key: str | None, model: str,
                           rows: Callable[[object], np.ndarray] | None, mix: Mix, query_rate: float | None,
                           attack_rate: float | None, seed: int, stop: threading.Event, counts: Counts,
                           ready_deadline_s: float) -> None:
    from mlaas_monitor.monitor.attacks import Domain

    if admin_key is None:
        raise UserError("the gateway's admin key is needed to create the accounts")
    admin = wait_for_gateway(gateway, admin_key, model, stop, ready_deadline_s)
    try:
        keys = provision(admin, mix, model)
        domain = Domain.from_public(admin.call("GET", f"/v1/models/{model}")["features"])
    finally:
        admin.close()
    benign_rows = rows(domain) if rows is not None and mix.benign else None
    for i, (who, users) in enumerate(user_names(mix).items()):
        if who.startswith("benign-"):
            start(who, benign_client, gateway, keys[users[0]], model, benign_rows, query_rate, seed + i, stop, counts, who)
        else:
            strategy = mix.collude_base if who.startswith("group-") else who.removeprefix("attacker-")
            start(who, attack_client, gateway, [keys[u] for u in users], model, strategy, attack_rate, seed + i, stop,
                  counts, who)
    log.info("gateway %s: %s", gateway, ", ".join(user_names(mix)))


def run_load(*, scheduler: str | None, job_rate: float, vcs: Sequence[str], gateway: str | None, admin_key: str | None,
             model: str, rows: Callable[[object], np.ndarray] | None, mix: Mix, query_rate: float | None,
             attack_rate: float | None, duration_s: float | None, seed: int, stop: threading.Event | None = None,
             ready_deadline_s: float = 120.0, token: str | None = None, tls: TlsFiles | None = None) -> Counts:
    """Run every client until ``duration_s`` passes (None: until ``stop`` is set); the counts.
    ``rows(domain)``: the benign users' rows, encoded for the model's public schema."""
    stop = stop or threading.Event()
    counts = Counts()
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def start(name: str, fn: Callable[..., None], *args: object) -> None:
        def body() -> None:
            try:
                fn(*args)
            except BaseException as e:  # a client that cannot go on stops the load, with its reason
                if not isinstance(e, UserError):
                    log.exception("%s failed", name)
                errors.append(e)
                stop.set()

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        threads.append(t)

    try:
        if scheduler:
            start("jobs", inject_jobs, scheduler, job_rate, list(vcs), seed, stop, counts, ready_deadline_s, token, tls)
        if gateway:
            _start_gateway_clients(start, gateway, admin_key, model, rows, mix, query_rate, attack_rate, seed, stop,
                                   counts, ready_deadline_s)  # fmt: skip
        stop.wait(duration_s)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    if errors:
        e = errors[0]
        raise e if isinstance(e, UserError) else UserError(f"load: {type(e).__name__}: {e}")
    return counts
