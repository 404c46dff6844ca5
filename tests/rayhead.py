"""A real local Ray cluster for tests and benchmarks: `ray start --head --block` on 127.0.0.1 with
every port our own and its own auth token (passed in the environment: ~/.ray is left alone),
stopped by ending the process we started (`ray start --block` stops its children on SIGTERM)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.polling import wait_until


@dataclass
class RayHead:
    address: str
    pid: int  # the `ray start` process; Ray's own processes are its descendants
    env: dict[str, str]  # for whatever connects to it: the token


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@contextmanager
def ray_head(num_cpus: int = 2) -> Iterator[RayHead]:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths live under it
    gcs, client, dash, agent, agent_grpc, metrics, env_agent, nm, om = free_ports(9)
    log_path = temp / "start.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--num-cpus={num_cpus}",
             "--node-ip-address=127.0.0.1", f"--port={gcs}", f"--ray-client-server-port={client}",
             "--include-dashboard=false", f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
             f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
             f"--runtime-env-agent-port={env_agent}", f"--node-manager-port={nm}", f"--object-manager-port={om}",
             f"--temp-dir={temp}", "--disable-usage-stats"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        wait_until(lambda: "Ray runtime started" in log_path.read_text() or proc.poll() is not None, 120,
                   "ray start")
        if proc.poll() is not None:
            raise RuntimeError(f"ray start failed:\n{log_path.read_text()}")
        yield RayHead(f"127.0.0.1:{gcs}", proc.pid, env)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)
