"""Start a scheduler and its agents as separate processes on 127.0.0.1 and stop them cleanly:
what ``analysim up``, the tests and the benchmark share. Every port is ephemeral; each process
reports what it bound through a port file, which is waited for with a deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from analysim.clusters import split_nodes
from analysim.errors import UserError
from analysim.tls import TlsFiles

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Proc:
    name: str  # scheduler, scheduler-<n> after a restart, agent-<i>
    popen: subprocess.Popen  # the running process
    port_file: Path  # where it writes its bound ports (JSON)
    log: Path  # its stdout and stderr
    info: dict = field(default_factory=dict)  # the port file's contents, once read

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies, however it dies (Linux), so
    that a killed `analysim up` or test leaves no scheduler or agent behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_port_file(proc: Proc, deadline_s: float) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.port_file.exists():
            proc.info = json.loads(proc.port_file.read_text())
            return proc.info
        if not proc.alive():
            raise UserError(f"{proc.name} exited with code {proc.popen.returncode}:\n{proc.tail()}")
        time.sleep(0.02)
    raise UserError(f"{proc.name} did not start within {deadline_s:g} s:\n{proc.tail()}")


class LocalRun:
    """A scheduler process and agent processes, with their logs and port files in ``workdir``.

    ``provision`` gives them credentials first: a token per agent (for its own nodes), one for
    clients and one for operators, in ``workdir/tokens`` (mode 600). ``tls`` is what the agents
    and clients present and trust (CA, and a certificate for mutual TLS). ``deadline_scale``
    stretches every deadline (port files, stops, the clients' calls and waits) on a machine
    slower than a quiet one; ``on_spawn`` is told of each process as it starts (the tests
    register it there, to be killed when the test ends whichever way it ends)."""

    def __init__(self, workdir: Path, python: str = sys.executable, tls: TlsFiles | None = None,
                 deadline_scale: float = 1.0, on_spawn: Callable[[subprocess.Popen], object] | None = None) -> None:
        self.workdir = Path(workdir).resolve()  # every process's files go here
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.python = python  # the interpreter the processes run with
        self.tls = tls or TlsFiles()  # the TLS files the processes serve and connect with
        self.deadline_scale = deadline_scale  # how many times longer than on a quiet machine a wait may take
        self.on_spawn = on_spawn  # told of every process started, before it is waited for
        self.scheduler: Proc | None = None  # the latest scheduler process
        self.agents: dict[int, Proc] = {}  # agent index -> its latest process
        self.cluster = ""  # the scheduler's --cluster, for the agents
        self._restarts = 0  # schedulers started before the latest (names its log)
        self.token_dir: Path | None = None  # the provisioned tokens; None without authentication

    def provision(self, node_names: list[str], processes: int) -> Path:
        """Write fresh tokens (``scheduler_svc.auth.write_tokens``) in ``workdir/tokens``."""
        from scheduler_svc.auth import write_tokens

        self.token_dir = write_tokens(self.workdir / "tokens", node_names, processes)
        return self.token_dir

    def token(self, role: str) -> str | None:
        """A provisioned token: "client", "operator" or "agent-<i>" (None without provisioning)."""
        from analysim.tokens import read_token

        return read_token(self.token_dir / f"{role}.token") if self.token_dir else None

    def client(self, role: str = "operator"):  # noqa: ANN201 — a SchedulerClient
        from scheduler_svc.client import SchedulerClient

        return SchedulerClient(self.target, token=self.token(role), tls=self.tls, deadline_scale=self.deadline_scale)

    def _auth_args(self) -> list[str]:
        d = self.token_dir
        if d is None:
            return []
        return ["--agent-token-file", str(d / "agents.tokens"), "--client-token-file", str(d / "client.token"),
                "--operator-token-file", str(d / "operator.token")]

    def _tls_client_args(self) -> list[str]:
        t = self.tls
        return [*(["--tls-ca", t.ca] if t.ca else []), *(["--tls-cert", t.cert, "--tls-key", t.key] if t.cert else [])]

    def _spawn(self, name: str, argv: list[str]) -> Proc:
        port_file = self.workdir / f"{name}.json"
        port_file.unlink(missing_ok=True)
        log = self.workdir / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with log.open("ab") as out:
            # Own session: Ctrl-C reaches only `analysim up`, which then stops the children in order.
            popen = subprocess.Popen([self.python, *argv, "--port-file", str(port_file)], stdout=out,
                                     stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        if self.on_spawn is not None:
            self.on_spawn(popen)
        return Proc(name, popen, port_file, log)

    def start_scheduler(self, args: list[str], deadline_s: float = 60.0) -> dict:
        name = "scheduler" if self._restarts == 0 else f"scheduler-{self._restarts}"
        self._restarts += 1
        self.scheduler = self._spawn(name, ["-m", "scheduler_svc", "serve", *self._auth_args(), *args])
        return wait_port_file(self.scheduler, deadline_s * self.deadline_scale)

    @property
    def target(self) -> str:
        assert self.scheduler is not None
        return f"{self.scheduler.info['host']}:{self.scheduler.info['grpc']}"

    def start_agent(self, index: int, cluster: str, first: int, count: int, extra: list[str] = (),
                    deadline_s: float = 60.0) -> Proc:
        old = self.agents.get(index)
        n = 0 if old is None else int(old.name.rsplit("-", 1)[-1]) + 1 if old.name.count("-") > 1 else 1
        name = f"agent{index}" if old is None else f"agent{index}-{n}"
        p = self._spawn(name, ["-m", "node_agent", "--scheduler", self.target, "--cluster", cluster,
                               "--first-node", str(first), "--nodes", str(count), "--agent-id", f"agent-{index}",
                               "--log-level", "WARNING", *self._tls_client_args(),
                               *(["--token-file", str(self.token_dir / f"agent-{index}.token")] if self.token_dir else []),
                               *extra])
        self.agents[index] = p
        wait_port_file(p, deadline_s * self.deadline_scale)
        return p

    def start_agents(self, cluster: str, nodes: int, processes: int, extra: list[str] = ()) -> None:
        self.cluster = cluster
        for i, (first, count) in enumerate(split_nodes(nodes, processes)):
            self.start_agent(i, cluster, first, count, extra)

    def kill(self, proc: Proc, sig: int = signal.SIGKILL, wait_s: float = 10.0) -> int | None:
        wait_s *= self.deadline_scale
        if proc.alive():
            proc.popen.send_signal(sig)
        try:
            return proc.popen.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            return proc.popen.wait(wait_s)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM everyone (agents first), then SIGKILL whoever outlives the grace period."""
        procs = [*self.agents.values(), *([self.scheduler] if self.scheduler else [])]
        for p in procs:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace_s * self.deadline_scale
        for p in procs:
            try:
                p.popen.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()

    def __enter__(self) -> LocalRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
