"""Kueue Workloads as a trace: what ``kubectl get workloads -A -o yaml`` (or ``-o json``) gives, a
``kind: List`` of ``kueue.x-k8s.io`` v1beta1 or v1beta2 Workloads (or Workloads as YAML documents).

Per Workload, one job: its id ``namespace/name``; submitted at ``metadata.creationTimestamp``
(counted from the earliest Workload's); its VC ``namespace/spec.queueName`` (the LocalQueue, which
the partition resolves: analysim.partitions.assign_queues); its ``qos`` ``spec.priorityClassName``
(v1beta2: ``spec.priorityClassRef.name``; the WorkloadPriorityClass of that name in the partition
gives its priority, as for every trace's jobs: ``spec.priority`` is checked, not used); what it asks for, every pod set's
per-pod requests (a container's limits where it has no request; the larger of the containers' sum
and each init container, as Kubernetes sizes a pod; pod-level ``resources`` where given) times its ``count``: ``nvidia.com/gpu`` as whole
GPUs, ``cpu`` and ``memory``. Its recorded admission (Trace.recorded_admit_s) is the time of its
``QuotaReserved`` condition (``Admitted`` on a Kueue older than that condition) while True; its
duration is its ``Finished`` condition's time less that admission. Kueue keeps only each
condition's latest transition, so a Workload evicted and readmitted has lost its first admission:
the earliest admission still recorded is taken (Finished less it is the last run's time, the
Workload's own run from zero). Left out, and counted: Workloads never admitted (``not_admitted``:
pending, or finished or deactivated before admission, no run time to replay) and admitted ones
not finished (``not_finished``: their run time is unknown). Errors name the file, the Workload's
line (and for a List its index) and the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from analysim.core.job import MAX_COUNT, JobSpec
from analysim.core.partition import CPU, GPU, MEMORY, MIB
from analysim.errors import InputFileError, UserError, read_text
from analysim.partitions.kueue import GROUP, MAX_FILE_BYTES, YAML_LOADER, error_line, quantity, too_deep
from analysim.traces.base import Row, TraceFormat

FORMAT = "kueue-workloads"
VERSIONS = ("v1beta1", "v1beta2")
# Workload files are larger than partition files (a cluster's whole record): 64 times as large.
MAX_BYTES = 64 * MAX_FILE_BYTES


class WorkloadInput:
    """A Workload list opened for the reader (what base.TraceScan expects of a format's input)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._shared: dict = {}
        self.recorded_admit_s: dict[str, float] = {}  # job id -> QuotaReserved time (file's clock)
        self.objects: list[tuple[int, str, Any]] = []  # (line, where in the file, the Workload)

    def __enter__(self) -> WorkloadInput:
        text = read_text(self.path, most=MAX_BYTES, what="a Workload list", encoding="utf-8-sig")
        try:
            for i, node in enumerate(yaml.compose_all(text, Loader=YAML_LOADER), 1):
                if node is None:
                    continue
                obj = yaml.SafeLoader("").construct_document(node)  # type: ignore[no-untyped-call]
                if isinstance(obj, dict) and obj.get("kind") == "List":
                    items = obj.get("items") or []
                    if not isinstance(items, list):
                        raise InputFileError(self.path, node.start_mark.line + 1, None, "items: expected a list")
                    items_node = next((v for k, v in node.value if k.value == "items"), None)
                    lines = [item.start_mark.line + 1 for item in items_node.value] if items else []
                    self.objects += [(line, f"document {i}, items[{k}]", o)
                                     for k, (line, o) in enumerate(zip(lines, items, strict=True))]
                elif obj is not None:
                    self.objects.append((node.start_mark.line + 1, f"document {i}", obj))
        except yaml.YAMLError as e:
            if too_deep(e):
                raise UserError(f"{self.path}: nested too deeply to be a Workload list") from None
            raise InputFileError(self.path, error_line(e, text), None,
                                 f"bad YAML or JSON: {getattr(e, 'problem', None) or e}") from None
        except RecursionError:
            raise UserError(f"{self.path}: nested too deeply to be a Workload list") from None
        if not self.objects:
            raise UserError(f"{self.path}: no Workloads in this file (kubectl get workloads -A -o yaml)")
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        pass

    def shared(self, value: Any) -> Any:
        return self._shared.setdefault(value, value)

    def error(self, line: int, column: str, problem: str) -> InputFileError:
        return InputFileError(self.path, line, column, problem)


class _Bad(Exception):
    """A field's problem: (field path, what is wrong)."""


def _get(obj: Any, path: str, kind: type | tuple[type, ...] = dict, required: bool = True) -> Any:
    """The field at dotted ``path`` of ``obj``, checked to be of ``kind``; None when absent and not
    required."""
    cur = obj
    for step in path.split("."):
        cur = cur.get(step) if isinstance(cur, dict) else None
        if cur is None:
            if required:
                raise _Bad(path, "missing")
            return None
    if not isinstance(cur, kind) or (isinstance(cur, bool) and kind is not bool):
        what = _KIND_NAMES.get(kind, "a time") if isinstance(kind, type) else "a time"
        raise _Bad(path, f"expected {what}, got {cur!r}"[:200])
    return cur


# What _get calls the types it expects (a tuple of them is a time: a string or a datetime).
_KIND_NAMES: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string", int: "a whole number"}


def _time(value: Any, path: str) -> float:
    """A Kubernetes time (RFC 3339; YAML may have read it as a datetime already) in seconds since 1970."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise _Bad(path, f"expected a time like 2024-05-01T10:00:00Z, got {value!r}") from None
    if not isinstance(value, datetime):
        raise _Bad(path, f"expected a time like 2024-05-01T10:00:00Z, got {value!r}")
    if value.tzinfo is None:  # (PyYAML gives a UTC time as naive)
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _pod_requests(spec: dict, where: str) -> dict[str, int]:
    """One pod's requests (base units as analysim.partitions.kueue.quantity gives them)."""
    def container_sum(key: str) -> list[dict[str, int]]:
        out = []
        # (a pod's own ``resources`` is read as the one container holding them)
        containers = [spec] if key == "resources" else _get(spec, key, list, required=False) or []
        for k, c in enumerate(containers):
            at = f"{where}.resources" if key == "resources" else f"{where}.{key}[{k}].resources"
            res = _get(c, "resources", dict, required=False) if isinstance(c, dict) else None
            got: dict[str, int] = {}
            for field in ("limits", "requests"):  # requests win: limits stand in for a missing one
                for r, v in (_get(res, field, dict, required=False) or {} if res else {}).items():
                    if r in (GPU, CPU, MEMORY):
                        try:
                            got[r] = quantity(v, r)
                        except ValueError as e:
                            raise _Bad(f"{at}.{field}.{r}", str(e)) from None
            out.append(got)
        return out

    total: dict[str, int] = {}
    for got in container_sum("containers"):
        for r, v in got.items():
            total[r] = total.get(r, 0) + v
    for got in container_sum("initContainers"):
        for r, v in got.items():
            total[r] = max(total.get(r, 0), v)
    for got in container_sum("resources"):  # pod-level resources (PodLevelResources): the pod's own
        total.update(got)
    return total


def _conditions(status: dict | None) -> dict[str, float]:
    """Condition type -> lastTransitionTime, for the conditions whose status is True."""
    out: dict[str, float] = {}
    for k, c in enumerate(_get(status, "conditions", list, required=False) or [] if status else []):
        at = f"status.conditions[{k}]"
        if not isinstance(c, dict):
            raise _Bad(at, "expected a mapping")
        if str(c.get("status")) == "True" and isinstance(c.get("type"), str):
            out[c["type"]] = _time(_get(c, "lastTransitionTime", (str, datetime)), f"{at}.lastTransitionTime")
    return out


def _workload(src: WorkloadInput, obj: Any) -> tuple[float, JobSpec | str]:
    """(creation time, the job or the reason it is left out) of one Workload."""
    if not isinstance(obj, dict):
        raise _Bad("", "expected a Workload, a mapping")
    kind, api = obj.get("kind"), obj.get("apiVersion")
    if kind != "Workload":
        raise _Bad("kind", f"expected Workload, got {kind!r} (kubectl get workloads -A -o yaml)")
    if api not in tuple(f"{GROUP}/{v}" for v in VERSIONS):
        raise _Bad("apiVersion", f"a Workload is {', '.join(GROUP + '/' + v for v in VERSIONS)}, not {api!r}")
    name = _get(obj, "metadata.name", str)
    namespace = _get(obj, "metadata.namespace", str, required=False) or ""
    created = _time(_get(obj, "metadata.creationTimestamp", (str, datetime)), "metadata.creationTimestamp")
    queue = _get(obj, "spec.queueName", str)
    gpus = cpu = memory = 0
    for k, ps in enumerate(_get(obj, "spec.podSets", list)):
        at = f"spec.podSets[{k}]"
        if not isinstance(ps, dict):
            raise _Bad(at, "expected a mapping")
        count = ps.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            raise _Bad(f"{at}.count", f"expected a whole number of pods, got {count!r}")
        req = _pod_requests(_get(ps, "template.spec", dict), f"{at}.template.spec")
        gpu = req.get(GPU, 0)  # (in thousandths, as quantity gives GPUs)
        if gpu % 1000:
            raise _Bad(f"{at}.template.spec", f"{GPU} must be whole GPUs, got {gpu / 1000:g}")
        gpus += gpu // 1000 * count
        cpu += req.get(CPU, 0) * count
        memory += math.ceil(req.get(MEMORY, 0) / MIB) * count
    # (v1beta1 names the class; v1beta2 refers to it, a WorkloadPriorityClass or a PriorityClass)
    priority_class = (_get(obj, "spec.priorityClassName", str, required=False)
                      or _get(obj, "spec.priorityClassRef.name", str, required=False) or "")
    _get(obj, "spec.priority", int, required=False)  # checked: the class's value is what a replay uses
    status = _get(obj, "status", dict, required=False)
    true = _conditions(status)
    admitted = [true[c] for c in ("QuotaReserved", "Admitted") if c in true]
    job_id = f"{namespace}/{name}" if namespace else name
    if not admitted:
        return created, "not_admitted"
    if "Finished" not in true:
        return created, "not_finished"
    admit = min(admitted)
    src.recorded_admit_s[job_id] = admit
    shared = src.shared
    return created, JobSpec(job_id=job_id, submit_s=created, duration_s=max(0.0, true["Finished"] - admit),
                            num_gpus=int(gpus), cpu_milli=shared(cpu), memory_mib=shared(memory),
                            vc=shared(f"{namespace}/{queue}" if namespace else queue), qos=shared(priority_class))


def _open(path: str | Path) -> WorkloadInput:
    return WorkloadInput(path)


def _rows(src: WorkloadInput) -> Iterator[Row]:
    for line, where, obj in src.objects:
        try:
            created, item = _workload(src, obj)
        except _Bad as e:
            field, problem = e.args
            raise InputFileError(src.path, line, None, f"{where}: {field + ': ' if field else ''}{problem}") from None
        yield line, created, item


READER = TraceFormat(FORMAT, _open, _rows, rebase=True, unique_ids=True,  # type: ignore[arg-type]
                     reasons=("not_admitted", "not_finished"))
