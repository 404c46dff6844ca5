"""Copies the Prometheus rules, the Grafana dashboards and Grafana's provisioning files into the
kustomizations that turn them into ConfigMaps, so that `kubectl kustomize` and `kubectl apply -k`
work without --load-restrictor (kustomize reads no file outside the kustomization's folder, which
is also what Argo CD and Flux expect).

deploy/prometheus and deploy/grafana stay the one source: edit those, then run
    python deploy/k8s/copy_files.py
tests/test_deploy_k8s.py fails while a copy differs from its source.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent.parent
K8S = DEPLOY / "k8s"
BASE_FILES = K8S / "base" / "files"
LOCAL_FILES = K8S / "overlays" / "local" / "files"


def copies() -> dict[Path, Path]:
    """Each copy (kustomization side) and its source (deploy/prometheus, deploy/grafana)."""
    pairs = {BASE_FILES / f.name: f for f in sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))}
    pairs |= {BASE_FILES / f.name: f for f in sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))}
    provisioning = DEPLOY / "grafana" / "provisioning"
    pairs[LOCAL_FILES / "datasources.yml"] = provisioning / "datasources" / "prometheus.yml"
    pairs[LOCAL_FILES / "dashboards.yml"] = provisioning / "dashboards" / "analysim.yml"
    return pairs


def stale() -> list[Path]:
    """The copies that are missing or differ from their source, and files no source has."""
    pairs = copies()
    out = [c for c, src in pairs.items() if not c.is_file() or c.read_bytes() != src.read_bytes()]
    extra = [f for d in (BASE_FILES, LOCAL_FILES) if d.is_dir() for f in sorted(d.iterdir()) if f not in pairs]
    return out + extra


def main() -> int:
    pairs = copies()
    for d in (BASE_FILES, LOCAL_FILES):
        d.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            if f not in pairs:
                f.unlink()
    for copy, src in pairs.items():
        shutil.copyfile(src, copy)
    print(f"{len(pairs)} files copied into {BASE_FILES.relative_to(DEPLOY.parent)} and "
          f"{LOCAL_FILES.relative_to(DEPLOY.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
