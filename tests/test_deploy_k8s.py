"""deploy/k8s: `kubectl kustomize` renders the base and the local overlay, every rendered object
validates (strictly) against the Kubernetes schemas (pip's kubernetes-validate), and the
manifests say what the stack needs: one scheduler with a Recreate strategy and its journal on
a PVC, agents as a StatefulSet whose pod name is the slice index and whose fleet size matches
its replicas, the gateway with its store on a PVC and the admin key from a Secret, probes on
/healthz and /readyz, requests and limits, scrape annotations, and the rules and dashboards as
ConfigMaps equal to deploy/prometheus and deploy/grafana's files. No flag is needed
(`kubectl apply -k` works as it is): the ConfigMaps' files are copies inside the kustomizations
(deploy/k8s/copy_files.py), and a stale copy fails here. The image is analysim/analysim at the
package's version, IfNotPresent (it is built and loaded locally, published nowhere)."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.test_deploy_grafana import deploy_module

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S_VERSION = "1.31.0"
VERSION = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"analysim/analysim:{VERSION}"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


@functools.cache
def render(path: str) -> tuple[dict, ...]:
    # No --load-restrictor: `kubectl apply -k` (and Argo CD, Flux) render with the default.
    r = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "k8s" / path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def validate(obj: dict) -> None:
    """``obj`` against the Kubernetes schemas, strictly (no field they do not know)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']}: {e.message}") from None


def find(objs: tuple[dict, ...], kind: str, name: str) -> dict:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"].startswith(name))


def containers(obj: dict) -> list[dict]:
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def env(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("path", ["base", "overlays/local", "overlays/replicas"])
def test_renders_and_validates(path: str) -> None:
    objs = render(path)
    assert objs
    for o in objs:
        validate(o)
    if path != "base":
        assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {"analysim"}


def test_the_stack_as_the_issue_describes_it() -> None:
    objs = render("overlays/local")
    sched = find(objs, "Deployment", "analysim-scheduler")
    assert sched["spec"]["replicas"] == 1 and sched["spec"]["strategy"]["type"] == "Recreate"
    claims = {v["persistentVolumeClaim"]["claimName"] for v in sched["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v}  # fmt: skip
    assert claims == {"analysim-journal"} and find(objs, "PersistentVolumeClaim", "analysim-journal")

    agents = find(objs, "StatefulSet", "analysim-agent")
    cluster = find(objs, "ConfigMap", "analysim-cluster")["data"]
    assert int(cluster["ANALYSIM_AGENTS"]) == agents["spec"]["replicas"], "every agent's slice count is the fleet size"
    (agent,) = containers(agents)
    assert env(agent)["ANALYSIM_AGENT_INDEX"] == {"fieldRef": {"fieldPath": "metadata.name"}}

    # Tokens (the scheduler listens beyond loopback): pod analysim-agent-N presents agent-N.token
    # of the Secret analysim-tokens, which `python -m scheduler_svc tokens` writes for slice N.
    tokens_dir = "/run/secrets/analysim-tokens"
    assert env(agent)["ANALYSIM_TOKEN_FILE"] == f"{tokens_dir}/$(ANALYSIM_AGENT_INDEX).token"
    (tok,) = [v["secret"] for v in agents["spec"]["template"]["spec"]["volumes"] if v["name"] == "tokens"]
    assert tok["secretName"] == "analysim-tokens"
    assert tok["items"] == [{"key": f"agent-{i}.token", "path": f"analysim-agent-{i}.token"}
                            for i in range(agents["spec"]["replicas"])]
    assert {m["mountPath"] for m in agent["volumeMounts"] if m["name"] == "tokens"} == {tokens_dir}
    sched_env = env(containers(sched)[0])
    for var, key in (("ANALYSIM_AGENT_TOKEN_FILE", "agents.tokens"), ("ANALYSIM_CLIENT_TOKEN_FILE", "client.token"),
                     ("ANALYSIM_OPERATOR_TOKEN_FILE", "operator.token")):
        assert sched_env[var] == f"{tokens_dir}/{key}"
    assert env(containers(find(objs, "Deployment", "analysim-traffic"))[0])["ANALYSIM_TOKEN_FILE"] == \
        f"{tokens_dir}/client.token"

    gw = find(objs, "Deployment", "analysim-gateway")
    vols = {v["name"]: v for v in gw["spec"]["template"]["spec"]["volumes"]}
    assert vols["store"]["persistentVolumeClaim"]["claimName"] == "analysim-store"
    assert vols["admin-key"]["secret"]["secretName"] == "analysim-admin-key"
    assert env(containers(gw)[-1])["ANALYSIM_ADMIN_KEY_FILE"] == "/run/secrets/analysim/admin_key"

    # Grafana's admin password: a Secret, never its default.
    graf = find(objs, "Deployment", "grafana")
    path = env(containers(graf)[0])["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    mount = next(m for m in containers(graf)[0]["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    vol = next(v for v in graf["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert vol["secret"]["secretName"] == "analysim-grafana" and "GF_SECURITY_ADMIN_PASSWORD" not in env(containers(graf)[0])

    for o in objs:
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in containers(o):
            assert {"requests", "limits"} <= set(c.get("resources", {})), f"{o['metadata']['name']}/{c['name']}"
        component = o["metadata"]["labels"].get("app.kubernetes.io/component")
        if component in ("scheduler", "agent", "gateway"):
            pod = o["spec"]["template"]
            assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
            main = pod["spec"]["containers"][0]
            assert main["image"] == IMAGE and main["imagePullPolicy"] == "IfNotPresent"
            assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
            assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
            assert {"name": "metrics", "containerPort": 9100} in main["ports"]
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_configmaps_are_the_repository_files() -> None:
    objs = render("overlays/local")
    rules = find(objs, "ConfigMap", "analysim-prometheus-rules")["data"]
    for name in ("recording.yml", "alerts.yml"):
        assert rules[name] == (DEPLOY / "prometheus" / "rules" / name).read_text()
    boards = find(objs, "ConfigMap", "analysim-grafana-dashboards")["data"]
    for f in (DEPLOY / "grafana" / "dashboards").glob("*.json"):
        assert json.loads(boards[f.name]) == json.loads(f.read_text())
    prom = yaml.safe_load(find(objs, "ConfigMap", "analysim-prometheus-config")["data"]["prometheus.yml"])
    relabel = prom["scrape_configs"][0]["relabel_configs"]
    assert {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"], "target_label": "job"} in relabel
    # The alerts select jobs by these names.
    components = {o["metadata"]["labels"].get("app.kubernetes.io/component") for o in objs if o["kind"] == "StatefulSet"
                  or o["kind"] == "Deployment"}  # fmt: skip
    assert {"scheduler", "agent", "gateway"} <= components


def test_the_project_image_everywhere_pinned_and_not_pulled() -> None:
    for o in render("overlays/replicas"):
        if o["kind"] in ("Deployment", "StatefulSet"):
            for c in containers(o):
                if c["image"].startswith("analysim/"):
                    assert (c["image"], c.get("imagePullPolicy")) == (IMAGE, "IfNotPresent"), \
                        f"{o['metadata']['name']}/{c['name']}"


def test_the_kustomizations_copies_are_fresh() -> None:
    copy_files = deploy_module(DEPLOY / "k8s" / "copy_files.py")
    assert set(copy_files.copies().values()) >= {*(DEPLOY / "prometheus" / "rules").glob("*.yml"),
                                                 *(DEPLOY / "grafana" / "dashboards").glob("*.json")}
    stale = [str(p.relative_to(DEPLOY)) for p in copy_files.stale()]
    assert not stale, f"stale copies {stale}: run python deploy/k8s/copy_files.py"


def test_service_monitor() -> None:
    (sm,) = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "optional" / "servicemonitor.yaml").read_text()) if d]
    services = [o for o in render("base") if o["kind"] == "Service"]
    selected = [s for s in services if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert {s["metadata"]["name"] for s in selected} == {"analysim-scheduler", "analysim-agent", "analysim-gateway"}
    for s in selected:
        assert "metrics" in {p["name"] for p in s["spec"]["ports"]}
