"""A case through the command line: its partition, cluster and trace written as files, ``analysim
simulate`` run on them in-process (its main function, as the shell calls it), and what the run's
output files say about the incoming workloads' arrival read back (``observe``)."""

from __future__ import annotations

import csv
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
    """What a run decided about a case, read from its events file."""

    # Each job admitted -> (when it was first admitted, its flavor per resource).
    admitted: dict[str, tuple[float, dict[str, str]]]
    # Each job evicted -> (when it was first evicted, Kueue's reason, the preemptor, its queue).
    evicted: dict[str, tuple[float, str, str, str]]


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
            out.writerow(_row(w, float(i), (w.ends_s or END_S) - i))
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
                 "--partition", str(partition), "--out", str(out), "--no-plots", "--no-progress",
                 "--events", str(out / "events.csv")])
    assert code == 0, f"analysim simulate exited {code}"
    return out


def observe(out: Path) -> Outcome:
    """What the run decided: each job's first admission and first eviction, from the events file.
    The one place the run's outputs are read."""
    admitted: dict[str, tuple[float, dict[str, str]]] = {}
    evicted: dict[str, tuple[float, str, str, str]] = {}
    with (out / "events.csv").open() as f:
        for row in csv.DictReader(f):
            t, job = float(row["time_s"]), row["job_id"]
            if row["event"] == "admit" and job not in admitted:
                admitted[job] = (t, dict(fr.split("=", 1) for fr in row["flavors"].split(";") if fr))
            elif row["event"] == "evict" and job not in evicted:
                evicted[job] = (t, row["reason"], row["preemptor"], row["preemptor_queue"])
    return Outcome(admitted, evicted)
