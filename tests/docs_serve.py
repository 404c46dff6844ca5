"""Running a docs block that starts servers in the foreground (``<!-- docs-test: serve -->``) as a
reader running its lines one by one in a few terminals would.

A line (backslash continuations joined) that starts one of the project's servers (``SERVERS``)
runs in the background instead: on ephemeral ports (each port flag the server has is set to 0,
whatever the block says), with ``--port-file``; the lines after it wait until it serves (its port
file is written and, for servers with a readiness probe, ``/readyz`` answers 200: tests/polling.py)
and see the ports the block names (``localhost:8080``, ``127.0.0.1:8070`` ...) as the bound ones.
The lines between servers run in one ``bash -e -u -o pipefail`` each, and every variable they set
is kept for the next lines and the servers (as the reader's shell keeps them; ``run_lines`` runs
every shell block so, and returns what it set for the file's next blocks). At the end each
server gets SIGTERM (the last started first) and must exit 0, with every process of its group
gone, within ``STOP_DEADLINE_S``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.polling import wait_until

START_DEADLINE_S = 90.0
STOP_DEADLINE_S = 30.0


@dataclass(frozen=True)
class ServerKind:
    command: tuple[str, ...]  # the words a line starts with
    ports: tuple[tuple[str, int, str], ...]  # (flag, its default, the port file's key)
    readyz: bool  # wait for /readyz on the port file's "metrics" port too


_GATEWAY_PORTS = (("--port", 8080, "http"), ("--grpc-port", 50051, "grpc"))
SERVERS = (
    ServerKind(("analysim", "gateway"), _GATEWAY_PORTS, True),
    ServerKind(("python", "-m", "mlaas_monitor", "gateway"), _GATEWAY_PORTS, True),
    ServerKind(("python", "-m", "mlaas_monitor.monitor", "serve"), (("--port", 8070, "http"),), False),
    # ready only once agents own every node: the port file is the sign it serves
    ServerKind(("python", "-m", "scheduler_svc", "serve"), (("--port", 0, "grpc"), ("--metrics-port", 0, "metrics")),
               False),  # fmt: skip
    ServerKind(("analysim", "agent"), (("--metrics-port", 0, "metrics"),), True),  # ready: connected
)
_started = itertools.count()  # names each server's port file and log
# Variables of the shell itself, not of what the block set.
_SHELL_VARS = {"_", "PWD", "OLDPWD", "SHLVL"}


@dataclass
class Server:
    where: str
    line: str
    proc: subprocess.Popen
    log: Path


def logical_lines(text: str) -> list[str]:
    """The block's lines with backslash continuations joined (as the shell reads them)."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def server_kind(line: str) -> ServerKind | None:
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    return next((k for k in SERVERS if tuple(words[:len(k.command)]) == k.command), None)


def _without_comment(line: str) -> str:
    return re.sub(r"\s+#[^'\"]*$", "", line)


def _flag(flag: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-]){re.escape(flag)}(?:\s+|=)(\d+)\b")


def on_free_ports(line: str, kind: ServerKind, port_file: Path) -> tuple[str, list[tuple[int, str]]]:
    """The server's line on ephemeral ports with a port file; which port it names (or takes by
    default) is which key of the port file."""
    line = _without_comment(line)
    named: list[tuple[int, str]] = []
    for flag, default, key in kind.ports:
        m = _flag(flag).search(line)
        if m:
            named.append((int(m.group(1)), key))
            line = line[:m.start(1)] + "0" + line[m.end(1):]
        else:
            named.append((default, key))
            line += f" {flag} 0"
    return f"{line} --port-file {shlex.quote(str(port_file))}", [(p, k) for p, k in named if p]


def with_ports(text: str, bound: dict[int, int]) -> str:
    """``host:PORT`` of a port the block named, as the server bound it."""
    for named, actual in bound.items():
        text = re.sub(rf"(?<=:){named}\b", str(actual), text)
    return text


def run_shell(where: str, text: str, work: Path, env: dict[str, str], timeout_s: float) -> dict[str, str]:
    """``text`` in bash; the environment it leaves (every variable it set: ``set -a``)."""
    state = work.parent / "tmp" / "docs-serve.env"
    script = f"set -a\n{text}\nenv -0 > {shlex.quote(str(state))}\n"
    r = subprocess.run(["bash", "-e", "-u", "-o", "pipefail", "-c", script], cwd=work, env=env, capture_output=True,
                       text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)  # fmt: skip
    if r.returncode != 0:
        raise AssertionError(f"{where}: these lines failed (exit {r.returncode}):\n{text}\n--- stdout (end)\n"
                             f"{r.stdout[-2000:]}\n--- stderr (end)\n{r.stderr[-3000:]}")
    pairs = (kv.split("=", 1) for kv in state.read_bytes().decode().split("\0") if "=" in kv)
    return {k: v for k, v in pairs if k not in _SHELL_VARS}


def _not_ready(info: dict) -> str:
    """Why /readyz (on every worker's metrics port) does not answer 200 yet; "" when it does."""
    ports = [w["metrics"] for w in info.get("workers", [])] or [info["metrics"]]
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5):
                pass
        except urllib.error.HTTPError as e:
            return f"/readyz on {port}: {e.code} {e.read().decode(errors='replace')[:300]}"
        except OSError as e:
            return f"/readyz on {port}: {e}"
    return ""


def start(where: str, line: str, kind: ServerKind, work: Path, env: dict[str, str]) -> tuple[Server, dict]:
    n = next(_started)
    port_file = work.parent / "tmp" / f"docs-serve-{n}.json"
    log = work.parent / "tmp" / f"docs-serve-{n}.log"
    port_file.unlink(missing_ok=True)
    cmd, named = on_free_ports(line, kind, port_file)
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    server = Server(where, cmd, proc, log)
    why = ["no port file"]

    def serving() -> dict | None:
        if proc.poll() is not None:
            raise AssertionError(f"{where}: {cmd}\nexited {proc.returncode} before serving:\n{log.read_text()[-3000:]}")
        if not port_file.exists():
            return None
        info = json.loads(port_file.read_text())
        why[0] = _not_ready(info) if kind.readyz else ""
        return None if why[0] else info

    try:
        info = wait_until(serving, START_DEADLINE_S, f"{where}: {cmd} to serve", poll_s=0.05)
    except AssertionError as e:
        stop(server, check=False)
        if str(e).startswith("timed out"):
            raise AssertionError(f"{e} ({why[0]}); its output:\n{log.read_text()[-3000:]}") from None
        raise
    except BaseException:
        stop(server, check=False)
        raise
    return server, {p: info[k] for p, k in named}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop(server: Server, check: bool = True) -> None:
    """SIGTERM; it and its children must be gone within the deadline, it with exit 0."""
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_DEADLINE_S)
        wait_until(lambda: not _group_alive(proc.pid), STOP_DEADLINE_S, f"{server.line}: its children to exit")
    except (subprocess.TimeoutExpired, AssertionError):
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if check:
            raise AssertionError(f"{server.where}: {server.line}\ndid not stop within {STOP_DEADLINE_S:g} s of "
                                 f"SIGTERM:\n{server.log.read_text()[-3000:]}") from None
    if check and proc.returncode != 0:
        raise AssertionError(f"{server.where}: {server.line}\nexited {proc.returncode} on SIGTERM:\n"
                             f"{server.log.read_text()[-3000:]}")


def run_lines(where: str, text: str, work: Path, env: dict[str, str], timeout_s: float,
              serve: bool) -> dict[str, str]:
    """The block's lines, with ``serve`` its servers in the background; the environment it leaves."""
    servers: list[Server] = []
    bound: dict[int, int] = {}
    pending: list[str] = []
    try:
        for line in logical_lines(text):
            kind = server_kind(line) if serve else None
            if kind is None:
                pending.append(line)
                continue
            if pending:
                env = run_shell(where, with_ports("\n".join(pending), bound), work, env, timeout_s)
                pending = []
            server, ports = start(where, with_ports(line, bound), kind, work, env)
            servers.append(server)
            bound.update(ports)
        if pending:
            env = run_shell(where, with_ports("\n".join(pending), bound), work, env, timeout_s)
    except BaseException:
        for s in reversed(servers):
            stop(s, check=False)
        raise
    for s in reversed(servers):
        stop(s)
    return env
