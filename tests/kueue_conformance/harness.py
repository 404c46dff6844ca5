"""A case through the command line: its partition, cluster and trace written as files, ``analysim
simulate`` run on them in-process (its main function, as the shell calls it), and what the run's
output files say about the incoming workloads' arrival read back (``observe``)."""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from analysim.cli import main
from analysim.core.partition import CPU, GPU, MEMORY
from analysim.partitions.kueue import quantity
from tests.kueue_conformance import ARRIVAL_S, END_S, Case, Workload
from tests.kueue_yaml import priority_doc

RACK_LABEL = "analysim.io/rack"
# Every node holds whatever the quotas of a case admit: admission is decided by quota alone.
NODE = {"count": 1, "gpus": 64, "cpu_milli": 10_000_000, "memory_mib": 100_000_000}


@dataclass(frozen=True)
class Outcome:
    """What a run decided about a case, read from its output files."""

    # Each workload that was evicted.
    victims: frozenset[str]
    # (victim's ClusterQueue, reason) of each eviction, counted.
    reasons: Counter[tuple[str, str]]
    # Each running or incoming workload admitted by the incoming workloads' arrival (running
    # ones: at their submission) -> its flavor per requested resource.
    admitted: dict[str, dict[str, str]]


def _priority_class(value: int) -> str:
    return f"priority-{value}" if value >= 0 else f"priority-minus-{-value}"


def _documents(partition: Path) -> list[dict]:
    """The partition file's objects (read with libyaml where PyYAML has it: the tables' files are
    large and the suite is to run in seconds)."""
    return list(yaml.load_all(partition.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def _flavor_racks(docs: list[dict]) -> dict[str, str | None]:
    """Each ResourceFlavor -> the rack its nodes are (None: every node)."""
    return {d["metadata"]["name"]: ((d.get("spec") or {}).get("nodeLabels") or {}).get(RACK_LABEL)
            for d in docs if d["kind"] == "ResourceFlavor"}


def write_inputs(case: Case, folder: Path) -> tuple[Path, Path, Path]:
    """The case's partition (with a WorkloadPriorityClass per priority used), cluster and trace."""
    workloads = case.running + case.incoming
    priorities = sorted({w.priority for w in workloads if w.priority})
    partition = folder / "kueue.yaml"
    partition.write_text(case.partition.lstrip().removeprefix("---").lstrip()
                         + "".join(priority_doc(_priority_class(p), p) for p in priorities) + "\n")
    racks = sorted({r for r in _flavor_racks(_documents(partition)).values() if r})
    cluster = folder / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "conformance", "nodes": [
        dict(NODE, rack=r, name_prefix=r) for r in (racks or ["all"])]}))
    trace = folder / "trace.csv"
    with trace.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["job_id", "submit_s", "duration_s", "num_gpus", "cpu_milli", "memory_mib", "vc", "qos"])
        for i, w in enumerate(case.running):
            out.writerow(_row(w, float(i), END_S - i))
        for w in case.incoming:
            out.writerow(_row(w, ARRIVAL_S, END_S - ARRIVAL_S))
    return partition, cluster, trace


def _row(w: Workload, submit: float, duration: float) -> list[object]:
    gpus, rest = divmod(quantity(w.requests.get(GPU, 0), GPU), 1000)
    mib, bytes_left = divmod(quantity(w.requests.get(MEMORY, 0), MEMORY), 2**20)
    assert not rest and not bytes_left, f"{w.name}: whole GPUs and MiB only"
    return [w.name, submit, duration, gpus, quantity(w.requests.get(CPU, 0), CPU), mib, w.queue,
            _priority_class(w.priority) if w.priority else ""]


def simulate(case: Case, folder: Path) -> Path:
    """Run the case through ``analysim simulate``; its output folder."""
    partition, cluster, trace = write_inputs(case, folder)
    out = folder / "out"
    code = main(["simulate", "--trace", str(trace), "--format", "canonical", "--cluster", str(cluster),
                 "--partition", str(partition), "--out", str(out), "--no-plots", "--no-progress"])
    assert code == 0, f"analysim simulate exited {code}"
    return out


def observe(case: Case, out: Path) -> Outcome:
    """What the run decided, from jobs.csv (each job's preemptions, first start and nodes) and
    summary.json (each ClusterQueue's evictions by reason). The one place the outputs are read."""
    docs = _documents(out.parent / "kueue.yaml")
    racks = _flavor_racks(docs)
    groups = {d["metadata"]["name"]: d["spec"].get("resourceGroups", []) for d in docs if d["kind"] == "ClusterQueue"}
    with (out / "jobs.csv").open() as f:
        rows = {r["job_id"]: r for r in csv.DictReader(f)}
    summary = json.loads((out / "summary.json").read_text())
    submitted = {w.name: (w, float(i)) for i, w in enumerate(case.running)}
    submitted.update({w.name: (w, ARRIVAL_S) for w in case.incoming})
    admitted = {}
    for name, (w, at) in submitted.items():
        row = rows.get(name)  # (not there: filtered out of the trace as never admissible)
        if row is None or row["first_start_s"] == "" or float(row["first_start_s"]) != at:
            continue
        rack = row["nodes"].split(";")[0].rsplit("-", 1)[0]  # (a node is named after its rack)
        admitted[name] = {r: _flavor_of(groups[w.queue], racks, r, rack) for r in w.requests}
    reasons: Counter[tuple[str, str]] = Counter()
    for queue, figures in summary["per_cluster_queue"].items():
        for reason, n in figures["evictions"].items():
            if n:
                reasons[(queue, reason)] += n
    victims = frozenset(name for name, row in rows.items() if int(row["preemptions"]))
    return Outcome(victims, reasons, admitted)


def _flavor_of(groups: list[dict], racks: dict[str, str | None], resource: str, rack: str) -> str:
    """The flavor a job on a node of ``rack`` holds of ``resource``: its ClusterQueue's flavor of
    the resource's group with nodes there."""
    for g in groups:
        if resource in g["coveredResources"]:
            found = [f["name"] for f in g["flavors"] if racks[f["name"]] in (None, rack)]
            assert len(found) == 1, f"{resource} on rack {rack}: flavors {found}"
            return found[0]
    raise AssertionError(f"no resource group covers {resource}")
