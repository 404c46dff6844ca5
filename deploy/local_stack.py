"""The stack of deploy/compose.yaml as local processes, without a container runtime: each
analysim service's own command, with the environment compose gives it, on 127.0.0.1 — ports
moved to free ones, container paths to a work folder, service names to addresses — started in
compose's dependency order; and Prometheus (when installed) with this repository's rules,
scraping them. What ``make stack`` runs, and what tests/test_deploy_stack.py checks.

    python deploy/local_stack.py [--workdir DIR] [--profiles cluster,gateway] [--overlay deploy/compose.kueue.yaml]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
COMPOSE = DEPLOY / "compose.yaml"
IMAGE = "analysim/analysim:latest"
LOOPBACK = "127.0.0.1"
HOST_VARS = ("ANALYSIM_HOST", "ANALYSIM_METRICS_HOST")
ADMIN_KEY_SECRET = "admin_key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def inherited() -> dict[str, str]:
    """This process's environment without ANALYSIM_* variables: a service gets those from
    compose.yaml alone, as in a container."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ANALYSIM_")}


def default_profiles() -> list[str]:
    """COMPOSE_PROFILES from the environment, else deploy/.env (as docker compose reads them)."""
    value = os.environ.get("COMPOSE_PROFILES")
    if value is None:
        env_file = DEPLOY / ".env"
        lines = env_file.read_text().splitlines() if env_file.exists() else []
        value = next((ln.split("=", 1)[1] for ln in lines if ln.startswith("COMPOSE_PROFILES=")), "")
    return [p for p in value.split(",") if p]


def scrape_every(config: dict, interval: str) -> None:
    """Scrape and evaluate the rules every ``interval`` (a test's pace) in a Prometheus config."""
    config["global"].update(scrape_interval=interval, evaluation_interval=interval, scrape_timeout=interval)


def write_rules(out: Path, alert_for: str | None = None) -> list[Path]:
    """deploy/prometheus's rule files (those prometheus.yml names) written under ``out`` at the
    same relative paths, every alert's ``for:`` replaced by ``alert_for``; their paths."""
    src = DEPLOY / "prometheus"
    paths = []
    for rel in yaml.safe_load((src / "prometheus.yml").read_text())["rule_files"]:
        rules = yaml.safe_load((src / rel).read_text())
        for g in rules["groups"]:
            for r in g["rules"]:
                if alert_for and "for" in r:
                    r["for"] = alert_for
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(yaml.safe_dump(rules, sort_keys=False))
        paths.append(out / rel)
    return paths


@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    depends_on: dict[str, str]  # service -> condition
    serves: bool  # answers /healthz on its metrics port (compose did not disable its healthcheck)
    proc: subprocess.Popen | None = None
    log: Path | None = None
    restarts: int = 0

    @property
    def metrics_port(self) -> int | None:
        v = self.env.get("ANALYSIM_METRICS_PORT")
        return int(v) if v else None


@dataclass
class LocalStack:
    workdir: Path
    profiles: list[str] = field(default_factory=default_profiles)
    overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # service -> env
    compose: Path = COMPOSE
    overlays: Sequence[Path] = ()  # compose files over it (-f ... -f ...): their environment and bind mounts
    python: str = sys.executable
    services: dict[str, Service] = field(default_factory=dict)
    ports: dict[tuple[str, int], int] = field(default_factory=dict)  # (service, container port) -> local port
    admin_key: str = ""
    prometheus: subprocess.Popen | None = None
    prometheus_port: int | None = None

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.doc = yaml.safe_load(self.compose.read_text())
        self.binds: dict[str, Path] = {}  # container folder -> the host's (a bind mount)
        for overlay in self.overlays:
            self._merge(yaml.safe_load(Path(overlay).read_text()))
        self.admin_key = os.environ.get("ANALYSIM_ADMIN_KEY") or secrets.token_urlsafe(32)
        chosen = {n: s for n, s in self.doc["services"].items() if s.get("image") == IMAGE and self._enabled(s)}
        for name, svc in chosen.items():
            for var, value in svc.get("environment", {}).items():
                if var.endswith("_PORT") and str(value).isdigit():
                    self.ports.setdefault((name, int(value)), free_port())
        for name, svc in chosen.items():
            self.services[name] = self._translate(name, svc, chosen)

    def _merge(self, overlay: dict) -> None:
        """An overlay's services over compose.yaml's, as compose merges them: environment by
        variable, volumes added; a bind mount (a relative host path, relative to compose.yaml's
        folder) is where its container path is read from."""
        for name, over in overlay.get("services", {}).items():
            svc = self.doc["services"][name]
            svc["environment"] = {**svc.get("environment", {}), **over.get("environment", {})}
            for v in over.get("volumes", []):
                host, container = str(v).split(":")[:2]
                if host.startswith("."):
                    self.binds[container] = (self.compose.parent / host).resolve()
                svc["volumes"] = [*svc.get("volumes", []), v]

    def _enabled(self, svc: dict) -> bool:
        wanted = svc.get("profiles")
        return not wanted or bool(set(wanted) & set(self.profiles))

    # ---- compose -> a local process ----

    def _translate(self, name: str, svc: dict, chosen: dict) -> Service:
        cmd = [str(c) for c in svc["command"]]
        argv = [self.python, *cmd[1:]] if cmd[0] == "python" else [self.python, "-m", *cmd]
        env: dict[str, str] = {}
        for var, value in {**svc.get("environment", {}), **self.overrides.get(name, {})}.items():
            env[var] = self._value(name, var, str(value), chosen)
        depends = svc.get("depends_on", {})
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        return Service(name, argv, env, {d: c.get("condition", "service_started") for d, c in depends.items()
                                         if d in chosen},
                       serves=not svc.get("healthcheck", {}).get("disable", False))  # fmt: skip

    def _value(self, name: str, var: str, value: str, chosen: dict) -> str:
        if var in HOST_VARS:
            return LOOPBACK
        if var.endswith("_PORT") and value.isdigit():
            return str(self.ports[(name, int(value))])
        if value.startswith("/"):
            return str(self._path(value))

        def address(m: re.Match[str]) -> str:  # "scheduler:50051", "http://gateway:8080"
            return f"{m.group(1) or ''}{LOOPBACK}:{self.ports[(m.group(2), int(m.group(3)))]}"

        names = "|".join(map(re.escape, chosen))
        return re.sub(rf"^(\w+://)?({names}):(\d+)$", address, value) if names else value

    def _path(self, container_path: str) -> Path:
        """A container path under the work folder, or in the host folder mounted there; a secret is
        written there."""
        for target, host in self.binds.items():
            if Path(container_path).is_relative_to(target):
                return host / Path(container_path).relative_to(target)
        local = self.workdir / container_path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        if container_path == f"/run/secrets/{ADMIN_KEY_SECRET}" and not local.exists():
            local.write_text(self.admin_key + "\n")
            local.chmod(0o600)
        return local

    # ---- processes ----

    def _satisfied(self, dep: str, condition: str) -> bool:
        d = self.services[dep]
        if d.proc is None:
            return False
        code = d.proc.poll()
        if code is not None and (condition != "service_completed_successfully" or code != 0):
            raise RuntimeError(f"{dep} exited with {code}:\n{self.tail(dep)}")
        if condition == "service_completed_successfully":
            return code == 0
        return condition != "service_healthy" or self.health(dep)[0]

    def start(self, name: str) -> Service:
        """Start one service now (its dependencies are the caller's business)."""
        s = self.services[name]
        suffix = f"-{s.restarts}" if s.restarts else ""
        s.log = self.workdir / "logs" / f"{name}{suffix}.log"
        from scheduler_svc.launcher import _die_with_parent  # a child dies with its parent

        with s.log.open("wb") as out:
            s.proc = subprocess.Popen(s.argv, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                      env={**inherited(), "PYTHONPATH": str(ROOT), **s.env}, preexec_fn=_die_with_parent)  # fmt: skip
        s.restarts += 1
        return s

    def start_all(self, deadline_s: float = 120.0) -> None:
        """Every service, each as soon as its depends_on conditions hold (as compose does)."""
        end = time.monotonic() + deadline_s
        waiting = [n for n, s in self.services.items() if s.proc is None]
        while waiting:
            for name in list(waiting):
                if all(self._satisfied(d, c) for d, c in self.services[name].depends_on.items()):
                    self.start(name)
                    waiting.remove(name)
            if waiting and time.monotonic() > end:
                raise RuntimeError(f"not started after {deadline_s:g} s: {', '.join(waiting)}")
            time.sleep(0.05)

    def health(self, name: str, path: str = "/healthz") -> tuple[bool, str]:
        from analysim.healthcheck import check

        return check(path, self.services[name].env)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.services[name].proc
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            p.wait(30)

    def tail(self, name: str, lines: int = 20) -> str:
        log = self.services[name].log
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log and log.exists() else ""

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM in reverse start order (traffic first, the scheduler last), then SIGKILL."""
        procs = [s.proc for s in reversed(self.services.values()) if s.proc is not None]
        if self.prometheus is not None:
            procs.insert(0, self.prometheus)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # ---- Prometheus ----

    def prometheus_config(self, scrape_interval: str | None = None, alert_for: str | None = None) -> Path:
        """deploy/prometheus/prometheus.yml with its targets at the local ports (targets of
        services not running dropped), and its rules (``for:`` replaced by ``alert_for``)."""
        src = DEPLOY / "prometheus"
        config = yaml.safe_load((src / "prometheus.yml").read_text())
        out = self.workdir / "prometheus"
        (out / "rules").mkdir(parents=True, exist_ok=True)
        if scrape_interval:
            scrape_every(config, scrape_interval)
        for job in config["scrape_configs"]:
            # DNS discovery (a service's replicas) becomes the one local process's target.
            for sd in job.pop("dns_sd_configs", []):
                job.setdefault("static_configs", []).append({"targets": [f"{n}:{sd['port']}" for n in sd["names"]]})
            for sc in job.get("static_configs", []):
                local = []
                for t in sc["targets"]:
                    host, _, port = t.rpartition(":")
                    if host == "localhost":
                        local.append(f"{LOOPBACK}:{self.prometheus_port}")
                    elif (host, int(port)) in self.ports:
                        local.append(f"{LOOPBACK}:{self.ports[(host, int(port))]}")
                sc["targets"] = local
        config["rule_files"] = [str(p) for p in write_rules(out, alert_for)]
        path = out / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start_prometheus(self, scrape_interval: str | None = None, alert_for: str | None = None,
                         deadline_s: float = 60.0) -> str:
        """Start Prometheus on a free port; its URL once ready."""
        exe = shutil.which("prometheus")
        if exe is None:
            raise FileNotFoundError("prometheus is not installed (Debian: apt-get install prometheus)")
        self.prometheus_port = free_port()
        config = self.prometheus_config(scrape_interval, alert_for)
        url = f"http://{LOOPBACK}:{self.prometheus_port}"
        log = (self.workdir / "logs" / "prometheus.log").open("wb")
        self.prometheus = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'prometheus' / 'data'}",
             f"--web.listen-address={LOOPBACK}:{self.prometheus_port}", "--web.enable-lifecycle"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        end = time.monotonic() + deadline_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return url
            except OSError:
                pass
            if self.prometheus.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"prometheus did not start: {(self.workdir / 'logs' / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def endpoints(self) -> list[str]:
        lines = []
        for name, s in self.services.items():
            parts = [f"--{var.removeprefix('ANALYSIM_').lower().replace('_', '-')} {LOOPBACK}:{v}" for var, v in s.env.items()
                     if var.endswith("_PORT") and var != "ANALYSIM_METRICS_PORT" and v.isdigit()]
            if s.serves:
                parts.append(f"metrics http://{LOOPBACK}:{s.metrics_port}/metrics")
            state = "running" if s.proc is not None and s.proc.poll() is None else "done"
            lines.append(f"{name:<16} {state:<8} {'   '.join(parts) or '-'}   log {s.log}")
        if self.prometheus_port:
            lines.append(f"{'prometheus':<16} running  {prometheus_ui(f'http://{LOOPBACK}:{self.prometheus_port}')}")
        return lines


def prometheus_ui(base: str) -> str:
    """The page to open: Debian's Prometheus is built without the new (React) UI, which its other
    pages 404 on, and serves the classic one under /classic/."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/classic/graph", timeout=5) as r:
            return f"{base}/classic/graph" if r.status == 200 else base
    except OSError:
        return base


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make stack", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=ROOT / "out" / "stack", help="logs, stores, journal (default out/stack)")
    p.add_argument("--profiles", help="comma-separated compose profiles (default: COMPOSE_PROFILES or deploy/.env)")
    p.add_argument("--overlay", type=Path, action="append", default=[], metavar="FILE",
                   help="a compose file over compose.yaml, as docker compose -f takes it (e.g. deploy/compose.kueue.yaml)")
    args = p.parse_args(argv)
    profiles = args.profiles.split(",") if args.profiles else default_profiles()
    stack = LocalStack(args.workdir, profiles, overlays=args.overlay)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stack.start_all()
        try:
            stack.start_prometheus()
        except FileNotFoundError as e:
            print(f"(no Prometheus: {e})")
        print("\n".join(stack.endpoints()))
        print(f"admin key: {stack.admin_key}  (also in {stack.workdir / 'run' / 'secrets' / ADMIN_KEY_SECRET})")
        if "tokens" in stack.services:
            d = Path(stack.services["tokens"].env["ANALYSIM_OUT"])
            print(f"scheduler tokens: {d}  (analysim submit/status --token-file {d / 'client.token'}, "
                  f"or operator.token to pause, resume, set the speed)")
        print("Grafana: import deploy/grafana/dashboards/*.json with the Prometheus above as the datasource. Ctrl-C stops.")
        while not stop:
            time.sleep(0.5)
            dead = [n for n, s in stack.services.items() if s.proc and s.proc.poll() not in (None, 0)]
            if dead:
                print(f"{dead[0]} exited with {stack.services[dead[0]].proc.returncode}:\n{stack.tail(dead[0])}")  # type: ignore[union-attr]
                return 1
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
