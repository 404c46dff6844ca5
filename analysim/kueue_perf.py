"""Kueue's scheduler performance scenarios (``test/performance/scheduler/configs/`` in Kueue's
repository) as AnalySIM inputs, and what Kueue's recorder and checker report of a replay.

The generator (``runner/generator/generator.go``) creates one ResourceFlavor ``rf``; per cohort
set ``count`` cohorts ``<class>-<i>``; in each, per queue set ``count`` ClusterQueues
``<class>-<set>-<i>-<cohort>`` with one resource, its nominal quota and borrowing limit and the
set's two preemption policies, each with a LocalQueue of its name; and per workloads set of a
queue, ``count`` rounds of its workloads, every one created after sleeping the set's creation
interval, each set in a goroutine of its own. Every create goes through the runner's client, whose
Workload requests are rate-limited (client-go's token bucket; Kueue's ``hack/make/test.mk`` runs
the runner with ``--qps=1000 --burst=2000``): the k-th workload of a set, counting from 0, is
created at (k + 1) × interval when the creates stay within that rate (the baseline, about 390 a
second), and later when they do not (large-scale asks about 21,000 a second: its 50,000 workloads
are created over 48 s, not 3.3 s). A workload's time to admission runs from its creation, as the
recorder's does. The runner (``runner/controller``) finishes a workload its
``runtimeMs`` after it saw it admitted; an evicted workload starts again from zero when admitted
again (``--preemption-cost restart``).

The one resource is ``cpu`` in Kueue's scenario; here it is the nodes' GPUs, one GPU per core
(the scenarios ask for whole cores), on nodes that never bind: only quota does, as in Kueue's
test, which has no nodes.

The recorder (``runner/recorder``) gives per workload class the mean time from creation to the
last admission (a workload evicted and admitted again is counted to its last admission), and per
ClusterQueue class the usage: the queues' quota in use integrated over time, over their nominal
quota times the time from the first event to the last; the checker compares those and the wall
time with ``rangespec.yaml``, whose comments carry the averages real Kueue recorded.
"""

from __future__ import annotations

import csv
import heapq
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from analysim.core.control_plane import ApiClient
from analysim.core.job import JobStatus
from analysim.errors import UserError
from analysim.events import EVENT_OF, kueue_state, queue_in

if TYPE_CHECKING:
    from analysim.core.engine import Engine
    from analysim.core.plugins.kueue import KueueState
    from analysim.core.records import Decision

RESOURCE = "nvidia.com/gpu"  # (the scenario's cpu: see the module docstring)
NODE_GPUS = 128
# The runner's client (hack/make/test.mk: --qps=1000 --burst=2000), through which each Workload is created.
RUNNER_QPS, RUNNER_BURST = 1000.0, 2000


@dataclass(frozen=True)
class Workload:
    name: str  # <class>-<set>-<round>-<index>, the generator's
    queue: str  # its ClusterQueue (and LocalQueue)
    klass: str
    created_s: float
    runtime_s: float
    priority: int
    request: int

    @property
    def job_id(self) -> str:
        """Its job's id in the replay (trace.csv's job_id): names are unique within a queue."""
        return f"{self.queue}/{self.name}"


@dataclass(frozen=True)
class Scenario:
    """A generator's objects, as Kueue YAML, and its workloads in creation order."""

    partition_yaml: str
    workloads: list[Workload]
    queue_class: dict[str, str]  # ClusterQueue -> its class
    nominal: dict[str, int]  # ClusterQueue -> nominal quota


_COHORT_KEYS = {"className", "count", "queuesSets"}
_QUEUE_KEYS = {"className", "count", "nominalQuota", "borrowingLimit", "reclaimWithinCohort", "withinClusterQueue",
               "workloadsSets"}
_SET_KEYS = {"count", "creationIntervalMs", "workloads"}
_WORKLOAD_KEYS = {"className", "runtimeMs", "priority", "request", "podCount", "tasConstraint", "tasLevel", "sliceSize"}
_POLICIES = {"Never", "LowerPriority", "LowerOrNewerEqualPriority", "Any"}


def _fields(where: str, value: object, known: set[str]) -> dict:
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - known)
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    return value


def _count(where: str, value: object, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UserError(f"{where}: expected an integer >= {least}, got {value!r}")
    return value


def _cores(where: str, value: object) -> int:
    """A quantity of whole cores ("20", 20)."""
    text = str(value).strip()
    if not re.fullmatch(r"\d+", text):
        raise UserError(f"{where}: expected a whole number of cores, got {value!r} (fractional and suffixed "
                        "quantities are not supported)")
    return int(text)


def _list(where: str, value: object) -> list:
    if not isinstance(value, list) or not value:
        raise UserError(f"{where}: expected a non-empty list")
    return value


def read_generator(path: str | Path) -> Scenario:
    """The scenario of a Kueue perf generator config; a one-line UserError naming the field when
    it is not one."""
    src = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise UserError(f"{src}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{src}: not YAML: {str(e).splitlines()[0]}") from None
    data = _fields(src, data, {"cohorts", "topology", "resourceFlavor"})
    if data.get("topology") is not None:
        raise UserError(f"{src}: topology: not supported (topology-aware scheduling is not modelled)")
    if data.get("resourceFlavor") is not None:
        raise UserError(f"{src}: resourceFlavor: not supported (a scenario's own flavor comes with topology)")
    docs = ["apiVersion: kueue.x-k8s.io/v1beta1\nkind: ResourceFlavor\nmetadata: {name: rf}"]
    queue_class: dict[str, str] = {}
    nominal: dict[str, int] = {}
    priorities: set[int] = set()
    # per workloads set of a queue: its interval (ms), the queue, its workloads' fields in order
    sets: list[tuple[int, str, list[tuple]]] = []
    for ci, cset in enumerate(_list(f"{src}: cohorts", data.get("cohorts"))):
        at = f"{src}: cohorts[{ci}]"
        cset = _fields(at, cset, _COHORT_KEYS)
        for c in range(_count(f"{at}.count", cset.get("count"), 1)):
            cohort = f"{cset.get('className', '')}-{c}"
            docs.append(f"apiVersion: kueue.x-k8s.io/v1beta1\nkind: Cohort\nmetadata: {{name: {cohort}}}")
            for qi, qset in enumerate(_list(f"{at}.queuesSets", cset.get("queuesSets"))):
                qat = f"{at}.queuesSets[{qi}]"
                qset = _fields(qat, qset, _QUEUE_KEYS)
                quota = _cores(f"{qat}.nominalQuota", qset.get("nominalQuota"))
                limit = _cores(f"{qat}.borrowingLimit", qset.get("borrowingLimit", 0))
                policies = {}
                for key in ("reclaimWithinCohort", "withinClusterQueue"):
                    policy = qset.get(key, "Never")
                    if policy not in _POLICIES:
                        raise UserError(f"{qat}.{key}: expected one of {', '.join(sorted(_POLICIES))}, got {policy!r}")
                    policies[key] = policy
                qsets = _workload_sets(qat, qset, priorities)  # (the same for each queue of the set)
                for q in range(_count(f"{qat}.count", qset.get("count"), 1)):
                    name = f"{qset.get('className', '')}-{qi}-{q}-{cohort}"
                    queue_class[name], nominal[name] = str(qset.get("className", "")), quota
                    docs.append(_queue_yaml(name, cohort, quota, limit, policies))
                    sets += [(interval, name, fields) for interval, fields in qsets]
    for p in sorted(priorities):
        docs.append(f"apiVersion: kueue.x-k8s.io/v1beta1\nkind: WorkloadPriorityClass\nmetadata: {{name: p{p}}}\n"
                    f"value: {p}")
    workloads = _created(sets)
    workloads.sort(key=lambda w: (w.created_s, w.queue, w.name))
    return Scenario("---\n".join(d + "\n" for d in docs), workloads, queue_class, nominal)


def _queue_yaml(name: str, cohort: str, quota: int, limit: int, policies: dict[str, str]) -> str:
    return (f"apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {{name: {name}}}\nspec:\n"
            f"  cohort: {cohort}\n  namespaceSelector: {{}}\n"
            f"  preemption: {{reclaimWithinCohort: {policies['reclaimWithinCohort']}, "
            f"withinClusterQueue: {policies['withinClusterQueue']}}}\n"
            f"  resourceGroups:\n  - coveredResources: [{RESOURCE}]\n    flavors:\n    - name: rf\n      resources:\n"
            f"      - {{name: {RESOURCE}, nominalQuota: {quota}, borrowingLimit: {limit}}}\n"
            f"---\napiVersion: kueue.x-k8s.io/v1beta1\nkind: LocalQueue\nmetadata: {{name: {name}}}\n"
            f"spec: {{clusterQueue: {name}}}")


def _workload_sets(qat: str, qset: dict, priorities: set[int]) -> list[tuple[int, list[tuple]]]:
    """The workloads sets of each queue of a queue set: each one's creation interval (ms) and its
    workloads' fields but the queue and the creation time, in the order its goroutine creates them."""
    out = []
    for si, wset in enumerate(_list(f"{qat}.workloadsSets", qset.get("workloadsSets"))):
        sat = f"{qat}.workloadsSets[{si}]"
        wset = _fields(sat, wset, _SET_KEYS)
        interval = _count(f"{sat}.creationIntervalMs", wset.get("creationIntervalMs"))
        templates = _list(f"{sat}.workloads", wset.get("workloads"))
        for ti, t in enumerate(templates):
            tat = f"{sat}.workloads[{ti}]"
            _fields(tat, t, _WORKLOAD_KEYS)
            if t.get("tasLevel"):
                raise UserError(f"{tat}.tasLevel: not supported (topology-aware scheduling is not modelled)")
            if t.get("podCount", 1) not in (0, 1):
                raise UserError(f"{tat}.podCount: only one pod per workload is supported, got {t.get('podCount')!r}")
            _count(f"{tat}.runtimeMs", t.get("runtimeMs"))
            _count(f"{tat}.priority", t.get("priority", 0))
        made = [(str(t.get("className", "")), t["runtimeMs"] / 1000, t.get("priority", 0),
                 _cores(f"{sat}.workloads[{i}].request", t.get("request"))) for i, t in enumerate(templates)]
        rounds = _count(f"{sat}.count", wset.get("count"))
        if rounds:
            priorities.update(priority for _, _, priority, _ in made)
        fields = [(f"{klass}-{si}-{r}-{i}", klass, runtime, priority, request)
                  for r in range(rounds) for i, (klass, runtime, priority, request) in enumerate(made)]
        out.append((interval, fields))
    return out


def _created(sets: list[tuple[int, str, list[tuple]]]) -> list[Workload]:
    """Every set's workloads with their creation times: each set sleeps its interval, then asks
    the runner's client to create its next workload, which is created when the client's rate
    limit lets it (the asks taken in time order; of one time, in the generator's order of sets).
    A set's j-th ask after its last delayed creation (at ``since``) is at since + j × interval,
    so that an undelayed set's times are exactly (k + 1) × interval."""
    client = ApiClient(RUNNER_QPS, RUNNER_BURST)
    out: list[Workload] = []
    asks = [(interval / 1000, n, 0, 0.0, 1) for n, (interval, _, fields) in enumerate(sets) if fields]
    heapq.heapify(asks)  # (ask time, set, its next workload, since, j)
    while asks:
        at, n, k, since, j = asks[0]
        interval, queue, fields = sets[n]
        name, klass, runtime, priority, request = fields[k]
        created = client.write(at, "create")
        out.append(Workload(name, queue, klass, created, runtime, priority, request))
        if k + 1 < len(fields):
            if created > at:
                since, j = created, 0
            heapq.heapreplace(asks, (since + (j + 1) * interval / 1000, n, k + 1, since, j + 1))
        else:
            heapq.heappop(asks)
    return out


def write_inputs(s: Scenario, out: Path) -> tuple[Path, Path, str]:
    """The scenario as files ``analysim simulate`` reads: partition.yaml, trace.csv (canonical),
    and the cluster (enough nodes that only quota binds)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "partition.yaml").write_text(s.partition_yaml)
    with open(out / "trace.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_s", "duration_s", "num_gpus", "vc", "qos"])
        for x in s.workloads:
            w.writerow([x.job_id, repr(x.created_s), repr(x.runtime_s), x.request, x.queue, f"p{x.priority}"])
    largest = max((x.request for x in s.workloads), default=1)
    if largest > NODE_GPUS:
        raise UserError(f"a workload asks for {largest} cores; at most {NODE_GPUS} are supported")
    # Quota borrowed comes from the cohort's own nominal quota, so all the queues together never
    # hold more than their nominal quotas: nodes for that, and a quarter more for what packing
    # whole requests onto nodes may strand (each node at most a request's size less one).
    nodes = math.ceil(1.25 * sum(s.nominal.values()) / NODE_GPUS) + 1
    return out / "partition.yaml", out / "trace.csv", f"{nodes}x{NODE_GPUS}"


# --- what Kueue's recorder reports -----------------------------------------------------------


class Recorder:
    """Kueue's runner recorder over one replay: it follows the engine's decisions as they are
    made (an event sink of ``simulation.run``, as the recorder watches the API server's events),
    and gives the runner's summary (summary.yaml's shape). What it reads of each decision is what
    the events file writes of it (``--events``), so that its figures are those of that file."""

    def __init__(self, s: Scenario) -> None:
        self.scenario = s
        self.engine: Engine | None = None  # the run's (attach)
        self.kueue: KueueState | None = None  # its quota tree: a job's ClusterQueue
        self.last_admit: dict[str, float] = {}  # job -> its last admission
        self.evictions: dict[str, int] = {}  # job -> times evicted
        self.finish: dict[str, float] = {}  # job -> when it completed
        self.held: dict[str, tuple[str, int, float]] = {}  # running job -> (its ClusterQueue, cores, admitted at)
        self.used: dict[str, float] = {}  # ClusterQueue -> cores × seconds held so far
        self.end = 0.0  # the last decision's time (the recorder's last event)

    def attach(self, engine: Engine) -> None:
        self.engine, self.kueue = engine, kueue_state(engine)
        engine.decision_log.add(self.decided)

    def decided(self, d: Decision) -> None:
        t, kind, job = d.time, EVENT_OF[d.kind], d.job_id
        self.end = max(self.end, t)
        if kind == "admit":
            self.last_admit[job] = t
            spec = self.engine.jobs[job].spec
            self.held[job] = (queue_in(self.kueue, spec.vc), spec.num_gpus, t)
        elif kind in ("evict", "complete") and job in self.held:
            queue, cores, since = self.held.pop(job)
            self.used[queue] = self.used.get(queue, 0.0) + cores * (t - since)
            if kind == "evict":
                self.evictions[job] = self.evictions.get(job, 0) + 1
            else:
                self.finish[job] = t

    def pending(self) -> None:
        """A job still pending at the end makes the end of the run an event of the recorder's (the
        events file writes each such job a row at that time)."""
        engine = self.engine
        if any(j.status is JobStatus.PENDING for j in engine.jobs.values()):
            self.end = max(self.end, engine.now)

    def summary(self) -> dict:
        """Kueue's runner summary of the replay followed."""
        s, end = self.scenario, self.end
        classes: dict[str, dict] = {}
        for w in s.workloads:
            job = w.job_id
            e = classes.setdefault(w.klass, {"count": 0, "admit": 0.0, "finish": 0.0, "evictions": 0})
            e["count"] += 1
            e["admit"] += self.last_admit.get(job, end) - w.created_s
            e["finish"] += self.finish.get(job, end) - w.created_s
            e["evictions"] += self.evictions.get(job, 0)
        cq: dict[str, dict] = {}
        for queue, c in s.queue_class.items():
            e = cq.setdefault(c, {"cpuUsed": 0, "nominalQuota": 0})
            e["cpuUsed"] += round(self.used.get(queue, 0.0) * 1000 * 1000)  # mCPU × ms
            e["nominalQuota"] += s.nominal[queue] * 1000
        elapsed_ms = round(end * 1000)
        for e in cq.values():
            e["cpuAverageUsage"] = e["cpuUsed"] // elapsed_ms if elapsed_ms else 0
            e["firstEventTimeMs"], e["lastEventTimeMs"] = 0, elapsed_ms
            e["usagePercent"] = e["cpuUsed"] * 100 / (e["nominalQuota"] * elapsed_ms) if elapsed_ms else 0.0
        return {
            "clusterQueueClasses": cq,
            "workloadClasses": {c: {"count": e["count"], "totalEvictions": e["evictions"],
                                    "averageTimeToAdmissionMs": round(e["admit"] * 1000 / e["count"]),
                                    "averageTimeToFinishMs": round(e["finish"] * 1000 / e["count"])}
                                for c, e in sorted(classes.items())},
            "wallMs": elapsed_ms,
        }


# --- what real Kueue recorded (rangespec.yaml) -----------------------------------------------

_AVERAGE = re.compile(r"(?:Average value|mean=)\s*([\d_.]+)\s*(ms|%)?", re.IGNORECASE)


def read_rangespec(path: str | Path) -> dict:
    """The checker's bounds and, from the comment before each, the average real Kueue recorded
    (``# Average value 76768`` / ``# mean=38.64%``; None when a bound has no such comment):
    {"wall": (bound_ms, avg_ms), "usage": {class: (min %, avg %)}, "admission": {class: (max ms, avg ms)}}."""
    src = str(path)
    try:
        text = Path(path).read_text()
        data = yaml.safe_load(text)
    except OSError as e:
        raise UserError(f"{src}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{src}: not YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{src}: expected a mapping")
    averages: dict[tuple[str, str], float] = {}
    section, note = "", ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            note += " " + stripped
            continue
        m = re.match(r"^(\s*)([A-Za-z0-9_.-]+)\s*:", line)
        if m:
            key = m.group(2)
            if not m.group(1):
                section = key
            found = _AVERAGE.search(note) or _AVERAGE.search(line.partition("#")[2])
            if found:
                averages[(section, key)] = float(found.group(1).replace("_", ""))
        note = ""

    def bounds(key: str) -> dict:
        got = data.get(key) or {}
        if not isinstance(got, dict):
            raise UserError(f"{src}: {key}: expected a mapping")
        return {str(k): (float(v), averages.get((key, str(k)))) for k, v in got.items()}

    wall = (data.get("cmd") or {}).get("maxWallMs")
    return {"wall": (wall, averages.get(("cmd", "maxWallMs"))),
            "usage": bounds("clusterQueueClassesMinUsage"),
            "admission": bounds("wlClassesMaxAvgTimeToAdmissionMs")}


def compare(summary: dict, spec: dict) -> list[dict]:
    """Rows: figure, ours, real Kueue's recorded average, the relative difference (points for
    usage), the checker's bound and whether ours passes it."""
    rows = []
    for c, e in summary["workloadClasses"].items():
        bound, avg = spec["admission"].get(c, (None, None))
        ours = e["averageTimeToAdmissionMs"]
        rows.append({"figure": f"time to admission, {c} (ms)", "ours": ours, "kueue": avg,
                     "difference": None if not avg else (ours - avg) / avg, "unit": "relative",
                     "bound": bound, "passes": None if bound is None else ours <= bound})
    for c, e in summary["clusterQueueClasses"].items():
        bound, avg = spec["usage"].get(c, (None, None))
        ours = round(e["usagePercent"], 1)
        rows.append({"figure": f"ClusterQueue usage, {c} (%)", "ours": ours, "kueue": avg,
                     "difference": None if avg is None else ours - avg, "unit": "points",
                     "bound": bound, "passes": None if bound is None else ours >= bound})
    bound, avg = spec["wall"]
    ours = summary["wallMs"]
    rows.append({"figure": "wall (ms)", "ours": ours, "kueue": avg, "difference": None if not avg else (ours - avg) / avg,
                 "unit": "relative", "bound": bound, "passes": None if bound is None else ours <= bound})
    return rows
