"""deploy/k8s/ray: the KubeRay RayJob and RayCluster, checked for structure (KubeRay's CRD schemas
are not available offline): the project's image everywhere, resources declared, token auth, the
entrypoint a valid `analysim sweep` whose SPEC (from the ConfigMap) passes the sweep's own checks
and whose cells fit the workers; `kubectl kustomize` builds it when kubectl is installed."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from analysim.cli import build_parser
from analysim.sweep.spec import expand

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RAY_DIR = DEPLOY / "k8s" / "ray"
# The user the image runs as (deploy/Dockerfile's useradd): Ray's pods must be the same.
IMAGE_UID = int(re.search(r"useradd [^\n]*--uid (\d+)", (DEPLOY / "Dockerfile").read_text()).group(1))
IMAGE = "analysim/analysim-ray:0.1.0"  # deploy/Dockerfile.ray over the service image


def docs() -> dict[str, dict]:
    out = {}
    for f in sorted(RAY_DIR.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                out[f"{d['kind']}/{d['metadata']['name'] if 'metadata' in d else f.name}"] = d
    return out


def quantity(q: str | int) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "m": 1e-3, "": 1}
    num, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q)).groups()
    return float(num) * units[unit]


def cluster_specs(d: dict) -> list[dict]:
    return [d["spec"]] if d["kind"] == "RayCluster" else [d["spec"]["rayClusterSpec"]]


def pods(spec: dict) -> list[tuple[dict, dict]]:
    groups = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
    return [(g, g["template"]["spec"]) for g in groups]


def entrypoint_sweep(job: dict) -> argparse.Namespace:
    first = job["spec"]["entrypoint"].split(";")[0]
    argv = shlex.split(first)
    assert argv[:2] == ["analysim", "sweep"], first
    return build_parser().parse_args(argv[1:])


def test_ray_manifests_are_kuberay_objects_from_the_project_image():
    d = docs()
    assert {"RayJob/analysim-sweep", "RayCluster/analysim-ray", "ConfigMap/analysim-sweep-spec"} <= set(d)
    for name in ("RayJob/analysim-sweep", "RayCluster/analysim-ray"):
        assert d[name]["apiVersion"] == "ray.io/v1"
        for spec in cluster_specs(d[name]):
            assert spec["authOptions"] == {"mode": "token"}, name  # every Ray endpoint needs the token
            assert spec["rayVersion"]
            assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # cells run on workers
            for group, pod in pods(spec):
                assert all(isinstance(v, str) for v in group["rayStartParams"].values())  # map[string]string
                assert pod["securityContext"]["runAsNonRoot"] is True
                assert pod["securityContext"]["runAsUser"] == IMAGE_UID, name  # the image's own user
                for c in pod["containers"]:
                    assert c["image"] == IMAGE, name
                    for kind in ("requests", "limits"):
                        assert {"cpu", "memory"} <= set(c["resources"][kind]), (name, c["name"])
                    assert c["securityContext"]["allowPrivilegeEscalation"] is False
            for w in spec["workerGroupSpecs"]:
                assert w["minReplicas"] <= w["replicas"] <= w["maxReplicas"]


def test_rayjob_runs_a_valid_sweep_that_fits_its_workers():
    d = docs()
    job = d["RayJob/analysim-sweep"]
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    args = entrypoint_sweep(job)
    assert args.engine == "ray"  # the address comes from RAY_ADDRESS, which the RayJob sets
    assert "analysim report /results/sweep" in job["spec"]["entrypoint"]
    spec = job["spec"]["rayClusterSpec"]
    head = spec["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in head["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    # The SPEC the entrypoint names is the ConfigMap's sweep.yaml, mounted on the head.
    spec_dir, spec_file = str(args.spec.parent), args.spec.name
    config = volumes[mounts[spec_dir]]["configMap"]["name"]
    sweep = expand(yaml.safe_load(d[f"ConfigMap/{config}"]["data"][spec_file]), spec_file)
    assert len(sweep.cells) == 24 and set(sweep.axes) == {"policy", "placement", "preemption", "seed"}
    # The trace it names and the --out folder are on the head's volumes.
    trace = sweep.cells[0].args.trace
    assert any(trace.startswith(p + "/") for p in mounts), trace
    assert any(str(args.out).startswith(p + "/") for p in mounts)
    for claim in ("analysim-traces", "analysim-sweep-results"):
        assert f"PersistentVolumeClaim/{claim}" in d
    # A cell's declared resources fit a worker.
    for w in spec["workerGroupSpecs"]:
        limits = w["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert args.cell_cpus <= float(w["rayStartParams"]["num-cpus"]) <= quantity(limits["cpu"])
        assert args.cell_memory * 2**20 <= quantity(limits["memory"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_builds_the_rayjob_and_its_inputs():
    r = subprocess.run(["kubectl", "kustomize", str(RAY_DIR)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in yaml.safe_load_all(r.stdout) if d)
    assert kinds == ["ConfigMap/analysim-sweep-spec", "PersistentVolumeClaim/analysim-sweep-results",
                     "PersistentVolumeClaim/analysim-traces", "RayJob/analysim-sweep"]
