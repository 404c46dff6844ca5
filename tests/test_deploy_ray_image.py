"""The KubeRay image holds what its workload needs: deploy/Dockerfile.ray built over
the service image (tests/containers.py; .ci/run builds it once) runs, as the image's own
user 10001, what KubeRay runs in the RayJob's head pod: `ray start --head`, then the RayJob's own
entrypoint (read from deploy/k8s/ray/rayjob.yaml: `analysim sweep ... --engine ray` on that Ray
cluster through RAY_ADDRESS, then `analysim report`), on a small SPEC mounted where the ConfigMap
would be and a results folder mounted where the PVC would be. The sweep's every cell is done, the
report embeds its PNG figures (matplotlib), and the image has the wget KubeRay's probes call.
Skipped only where podman cannot run containers."""

from __future__ import annotations

import csv
import secrets
from pathlib import Path

import pytest
import yaml

from tests import containers

ROOT = Path(__file__).resolve().parent.parent
RAY_DIR = ROOT / "deploy" / "k8s" / "ray"
SPEC = "jobs: 120\ncluster: tiny\npolicy: [fifo, srtf]\npreemption: [false, true]\nseed: 1\n"
CELLS = 4

problem = containers.podman_problem()
pytestmark = [pytest.mark.skipif(problem is not None, reason=str(problem)), pytest.mark.timeout(900)]


def rayjob() -> dict:
    return next(d for d in yaml.safe_load_all((RAY_DIR / "rayjob.yaml").read_text()) if d and d["kind"] == "RayJob")


def test_the_rayjob_runs_in_the_kuberay_image(tmp_path: Path) -> None:
    image = containers.for_test("ray")
    job = rayjob()
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    uid = head["securityContext"]["runAsUser"]
    # Where the RayJob mounts the SPEC's ConfigMap and the results PVC, the test mounts folders.
    spec_dir, results = tmp_path / "spec", tmp_path / "results"
    spec_dir.mkdir()
    results.mkdir()
    (spec_dir / "sweep.yaml").write_text(SPEC)
    for p in (tmp_path, spec_dir, spec_dir / "sweep.yaml"):
        p.chmod(0o755)
    results.chmod(0o777)  # as the PVC's fsGroup makes it writable for the pod's user
    script = (
        "set -e; command -v wget >/dev/null; test \"$(id -u)\" = " + str(uid) + "; "
        "ray start --head --num-cpus 2 --include-dashboard false --disable-usage-stats >/dev/null; "
        "export RAY_ADDRESS=127.0.0.1:6379; set +e; " + job["spec"]["entrypoint"] + "; rc=$?; ray stop >/dev/null; exit $rc"
    )
    name = f"analysim-test-ray-{secrets.token_hex(3)}"
    try:
        r = containers.podman(
            "run", "--name", name, "--no-healthcheck", "--user", f"{uid}:{uid}", "--shm-size", "512m",
            "-v", f"{spec_dir}:{mounts['spec']}:ro", "-v", f"{results}:{mounts['results']}",
            image, "bash", "-c", script, check=False, timeout=600)
    finally:
        containers.podman("rm", "-f", "--volumes", name, check=False)  # and the image VOLUME's anonymous one
    assert r.returncode == 0, f"the RayJob's entrypoint failed in the image:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = results / "sweep"
    table = list(csv.DictReader((out / "results.csv").open()))
    assert len(table) == CELLS and {t["status"] for t in table} == {"ok"}, table
    assert f"{CELLS} cells ran" in r.stdout and "2 CPUs in 1 node(s)" in r.stdout, r.stdout  # on the Ray cluster
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 1, "the report has no figure (matplotlib missing?)"
