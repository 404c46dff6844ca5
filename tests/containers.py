"""Container images for the tests that run the stack in real containers (podman), made without an
image registry: Debian root filesystems from mmdebstrap, imported into podman as the Dockerfile's
BASE and as a Prometheus image, then deploy/Dockerfile built on that base, and deploy/Dockerfile.ray
on that image (the KubeRay image: the core is compiled once for both). Every image is tagged by
a hash of what it is made from (the mmdebstrap command; the Dockerfile, its build arguments and the
files of the build context), so an existing one is reused and a change rebuilds it.

.ci/run builds them once before `make test` (which then pays nothing for them):
    python3 -m tests.containers build          # prints ANALYSIM_TEST_*_IMAGE=... lines
Standard library only: it runs before the project's virtualenv exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
RAY_DOCKERFILE = ROOT / "deploy" / "Dockerfile.ray"
SUITE = "bookworm"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The Dockerfile's BASE: python3 (3.11 on bookworm), venv, headers for the compiled core, `python`.
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "python-is-python3", "ca-certificates")
# Debian's Prometheus, run as nobody with its data in /prometheus (as prom/prometheus is).
PROMETHEUS_PACKAGES = ("prometheus", "ca-certificates")
PROMETHEUS_HOOK = 'mkdir -p "$1/prometheus" && chown 65534:65534 "$1/prometheus"'
PROMETHEUS_CHANGES = ("USER nobody", "WORKDIR /prometheus", 'ENTRYPOINT ["/usr/bin/prometheus"]')
ENV = {"base": "ANALYSIM_TEST_BASE_IMAGE", "prometheus": "ANALYSIM_TEST_PROMETHEUS_IMAGE",
       "analysim": "ANALYSIM_TEST_IMAGE", "ray": "ANALYSIM_TEST_RAY_IMAGE"}
# The label on every image (and build layer) the suite makes: what it prunes is only its own.
SUITE_LABEL = "org.analysim.test-suite=1"
# One build or prune of the suite's images at a time on this machine (see _one_at_a_time).
BUILD_LOCK = Path(tempfile.gettempdir()) / "analysim-test-images.lock"


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])}…: {r.stderr.strip()[-2000:]}")
    return r


def podman_problem() -> str | None:
    """Why podman cannot run containers here, or None when it can."""
    if shutil.which("podman") is None:
        return "podman not installed (Debian: apt-get install podman runc catatonit; .ci/run does)"
    r = subprocess.run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    if r.returncode != 0:
        return f"podman info fails: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}"
    return None


def exists(tag: str) -> bool:
    return podman("image", "exists", tag, check=False).returncode == 0


@contextlib.contextmanager
def _one_at_a_time() -> Iterator[None]:
    """Hold the machine's lock on the suite's image builds: podman's storage is shared by every
    process and checkout, and a prune of the suite's dangling layers while another build reads
    them as its cache fails that build ("checking if cached image exists from a previous build:
    ... layer not known"), as two workers building the analysim and Ray images at once did."""
    with BUILD_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def context_files() -> list[Path]:
    """The build context's files, as .dockerignore lets them in (its `*`, `!path` and
    `**/NAME` lines: the forms the project's file uses)."""
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    keep = [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]
    drop = [ln[3:] for ln in lines if ln.startswith("**/")]
    out = []
    for k in keep:
        p = ROOT / k
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            rel = f.relative_to(ROOT)
            if f.is_file() and not any(rel.match(pat) or any(part == pat for part in rel.parts) for pat in drop):
                out.append(f)
    return out


def _rootfs_image(repo: str, packages: tuple[str, ...], hook: str = "", changes: tuple[str, ...] = ()) -> str:
    tag = f"localhost/{repo}:{digest(SUITE, *packages, hook, *changes, SUITE_LABEL)}"
    if exists(tag):
        return tag
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap not installed (Debian: apt-get install mmdebstrap; .ci/run does)")
    with _one_at_a_time():
        return tag if exists(tag) else _import_rootfs(tag, packages, hook, changes)


def _import_rootfs(tag: str, packages: tuple[str, ...], hook: str, changes: tuple[str, ...]) -> str:
    with tempfile.TemporaryDirectory(prefix="analysim-rootfs-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        cmd = ["mmdebstrap", "--variant=minbase", f"--include={','.join(packages)}", "--quiet"]
        if hook:
            cmd.append(f"--customize-hook={hook}")
        r = subprocess.run([*cmd, SUITE, str(tar)], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"mmdebstrap {tag}: {r.stderr.strip()[-2000:]}")
        labelled = (*changes, f"LABEL {SUITE_LABEL}")
        podman("import", *(a for c in labelled for a in ("--change", c)), str(tar), tag, timeout=600)
    return tag


def base_image() -> str:
    return _rootfs_image("analysim-base", BASE_PACKAGES)


def prometheus_image() -> str:
    return _rootfs_image("analysim-prometheus", PROMETHEUS_PACKAGES, PROMETHEUS_HOOK, PROMETHEUS_CHANGES)


def analysim_image(base: str | None = None) -> str:
    """deploy/Dockerfile built on the local base; its tag."""
    base = base or base_image()
    files = context_files()
    h = digest(_image_id(base), SUITE_LABEL, DOCKERFILE.read_bytes(),
               *(x for f in files for x in (str(f.relative_to(ROOT)), f.read_bytes())))
    return _built("localhost/analysim/analysim", h, DOCKERFILE, {"BASE": base})


def ray_image(service: str | None = None) -> str:
    """deploy/Dockerfile.ray built on the service image (analysim_image); its tag."""
    service = service or analysim_image()
    h = digest(_image_id(service), SUITE_LABEL, RAY_DOCKERFILE.read_bytes())
    return _built("localhost/analysim/analysim-ray", h, RAY_DOCKERFILE, {"IMAGE": service})


def _image_id(tag: str) -> str:
    return podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def _built(repo: str, h: str, dockerfile: Path, build_args: dict[str, str]) -> str:
    """The image of ``repo`` whose inputs hash to ``h``: found, or built now."""
    tag = f"{repo}:ctx-{h}"
    if exists(tag):
        return tag
    with _one_at_a_time():
        return tag if exists(tag) else _build(tag, repo, dockerfile, build_args)


def _build(tag: str, repo: str, dockerfile: Path, build_args: dict[str, str]) -> str:
    args = ["build", "--format", "docker", "--network", "host", "-f", str(dockerfile), "-t", tag,
            "--label", SUITE_LABEL]
    for name, value in build_args.items():
        args += ["--build-arg", f"{name}={value}"]
    if CA_BUNDLE.is_file():  # pip in the build verifies the package index with the host's CAs
        args += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    podman(*args, str(ROOT), timeout=3600)
    # Older builds of the same image are stale: drop them, and the dangling layers the suite's
    # builds left (by their label: another project's dangling images are not ours to remove).
    for line in podman("images", "--format", "{{.Repository}}:{{.Tag}}", repo).stdout.split():
        if line.startswith(f"{repo}:ctx-") and line != tag:
            podman("rmi", line, check=False)
    _prune_suite_layers()
    return tag


def prune_suite_layers() -> None:
    """Remove the dangling images the suite's builds left, and only those, between builds."""
    with _one_at_a_time():
        _prune_suite_layers()


def _prune_suite_layers() -> None:
    """(prune_suite_layers, for a caller that holds the lock)"""
    podman("image", "prune", "-f", "--filter", f"label={SUITE_LABEL}", check=False)


def from_env_or_build(kind: str) -> str:
    """The image .ci/run built (its variable), else built (or found) now."""
    tag = os.environ.get(ENV[kind])
    if tag and exists(tag):
        return tag
    build = {"base": base_image, "prometheus": prometheus_image, "analysim": analysim_image,
             "ray": ray_image}[kind]
    return build()


def for_test(kind: str) -> str:
    """from_env_or_build for a test: skipped (with the reason) where the base images cannot be made."""
    import pytest

    try:
        return from_env_or_build(kind)
    except RuntimeError as e:
        if "mmdebstrap not installed" in str(e):
            pytest.skip(str(e))
        raise


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print("usage: python3 -m tests.containers build", file=sys.stderr)
        return 2
    problem = podman_problem()
    if problem:
        print(f"tests.containers: {problem}: the container tests will be skipped", file=sys.stderr)
        return 0
    base = base_image()
    service = analysim_image(base=base)
    tags = {"base": base, "prometheus": prometheus_image(), "analysim": service, "ray": ray_image(service)}
    for kind, tag in tags.items():
        print(f"{ENV[kind]}={tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
