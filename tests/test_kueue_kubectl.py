"""A real cluster's objects as input: what ``kubectl get ... -o yaml|json`` gives as --partition, a
Workload list as a trace (format kueue-workloads) with its recorded admissions, and ``analysim
fidelity`` on a replay of it. The objects are Kueue's documented examples (tests/fixtures/kueue_dump,
each file says where from)."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

import analysim.cli
import analysim.report
from analysim.clusters import parse_cluster
from analysim.errors import UserError
from analysim.partitions import assign_queues
from analysim.partitions.kueue import read_kueue
from analysim.traces import load_trace, write_canonical

DUMP = Path(__file__).resolve().parent / "fixtures" / "kueue_dump"
PARTITION = DUMP / "partition.yaml"
WORKLOADS = DUMP / "workloads.yaml"
TINY = parse_cluster("tiny")


def _served(obj: dict, i: int) -> dict:
    """The object as the API server returns it: metadata it fills in, and a status."""
    obj = copy.deepcopy(obj)
    obj["metadata"].update({
        "uid": f"5f0c2d3e-0000-4000-8000-{i:012d}", "resourceVersion": str(4000 + i), "generation": 1,
        "creationTimestamp": "2025-01-15T09:00:00Z",
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj)},
        "managedFields": [{"apiVersion": obj["apiVersion"], "fieldsType": "FieldsV1", "manager": "kubectl-client-side-apply",
                           "operation": "Update", "time": "2025-01-15T09:00:00Z", "fieldsV1": {"f:spec": {}}}],
    })
    if obj["kind"] != "WorkloadPriorityClass":
        obj["status"] = {"conditions": [{"type": "Active", "status": "True", "reason": "Ready", "message": "Can admit new workloads",
                                         "lastTransitionTime": "2025-01-15T09:00:01Z", "observedGeneration": 1}]}
    return obj


def _kubectl_list(objects: list[dict]) -> dict:
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
            "items": [_served(o, i) for i, o in enumerate(objects)]}


def _objects() -> list[dict]:
    return [d for d in yaml.safe_load_all(PARTITION.read_text()) if d]


def _same_partition(path: Path) -> None:
    want, want_warnings = read_kueue(PARTITION, TINY)
    got, got_warnings = read_kueue(path, TINY)
    assert dataclasses.replace(got, source=want.source) == want
    assert got_warnings == want_warnings == []


def test_a_kubectl_yaml_list_reads_as_the_multi_document_file(tmp_path):
    path = tmp_path / "partition.yaml"
    path.write_text(yaml.safe_dump(_kubectl_list(_objects()), sort_keys=True))
    _same_partition(path)


def test_a_kubectl_json_list_reads_as_the_multi_document_file(tmp_path):
    path = tmp_path / "partition.json"
    path.write_text(json.dumps(_kubectl_list(_objects()), indent=4))
    _same_partition(path)


def test_a_list_among_documents_reads_as_its_objects(tmp_path):
    objects = _objects()
    path = tmp_path / "partition.yaml"
    path.write_text(yaml.safe_dump(objects[0]) + "---\n" + yaml.safe_dump(_kubectl_list(objects[1:3]))
                    + "---\n" + yaml.safe_dump_all(objects[3:]))
    _same_partition(path)


def test_local_queues_of_one_name_in_two_namespaces_are_named_by_namespace(tmp_path):
    objects = _objects()
    other = copy.deepcopy(next(o for o in objects if o["kind"] == "LocalQueue"))
    other["metadata"]["namespace"] = "team-b"
    path = tmp_path / "partition.yaml"
    path.write_text(yaml.safe_dump(_kubectl_list([*objects, other])))
    partition, _ = read_kueue(path, TINY)
    assert dict(partition.queue_of) == {"default/user-queue": "cluster-queue", "team-b/user-queue": "cluster-queue"}
    jobs, reasons = assign_queues(load_trace(WORKLOADS, "kueue-workloads").jobs, partition)
    assert {j.vc for j in jobs} == {"default/user-queue"} and not reasons
    # One namespace's: the LocalQueue is its name alone, and a Workload's namespace/queue finds it.
    alone, _ = read_kueue(PARTITION, TINY)
    jobs, reasons = assign_queues(load_trace(WORKLOADS, "kueue-workloads").jobs, alone)
    assert {j.vc for j in jobs} == {"user-queue"} and not reasons


# The fixture's Workloads (created, QuotaReserved, Finished; minutes past 10:00): 1 at 0, 0, 10;
# 2 at 0, 0.5, 5.5; 3 at 1, 3, 13; 4 at 2, 12, 22; 5 pending; 6 admitted, running.
EXPECTED_ROWS = [
    ["default/sample-job-1", "0.0", "600.0", "0", "1000", "3000", "600", "default/user-queue", "", "", "sample-priority", "0.0"],
    ["default/sample-job-2", "0.0", "300.0", "0", "1000", "3000", "600", "default/user-queue", "", "", "sample-priority", "30.0"],
    ["default/sample-job-3", "60.0", "600.0", "0", "1000", "3000", "600", "default/user-queue", "", "", "", "180.0"],
    ["default/sample-job-4", "120.0", "600.0", "0", "1000", "3000", "600", "default/user-queue", "", "", "", "720.0"],
]


def test_workloads_convert_to_the_expected_trace_rows(tmp_path):
    trace = load_trace(WORKLOADS, "kueue-workloads")
    assert trace.filtered == {"not_admitted": 1, "not_finished": 1}
    out = tmp_path / "trace.csv"
    write_canonical(trace, out)
    rows = list(csv.reader(out.open()))
    assert rows[0][-1] == "recorded_admit_s" and rows[1:] == EXPECTED_ROWS
    # The canonical file reads back with its recorded admissions, and writes the same bytes.
    again = load_trace(out)
    assert again.recorded_admit_s == trace.recorded_admit_s == {"default/sample-job-1": 0.0, "default/sample-job-2": 30.0,
                                                                "default/sample-job-3": 180.0, "default/sample-job-4": 720.0}
    write_canonical(again, tmp_path / "again.csv")
    assert (tmp_path / "again.csv").read_bytes() == out.read_bytes()


def test_workloads_as_json_are_the_same_trace(tmp_path):
    path = tmp_path / "workloads.json"
    path.write_text(json.dumps(yaml.safe_load(WORKLOADS.read_text()), indent=4))
    a, b = load_trace(WORKLOADS, "kueue-workloads"), load_trace(path)  # (told from its first character)
    assert (a.jobs, a.recorded_admit_s, a.filtered) == (b.jobs, b.recorded_admit_s, b.filtered)


def test_a_canonical_file_without_recorded_admissions_writes_as_before(tmp_path):
    trace = load_trace(WORKLOADS, "kueue-workloads")
    trace.recorded_admit_s = {}
    out = tmp_path / "trace.csv"
    write_canonical(trace, out)
    lines = out.read_text().splitlines()
    assert lines[0] == "job_id,submit_s,duration_s,num_gpus,gpu_milli,cpu_milli,memory_mib,vc,user,gpu_models,qos"
    assert lines[1:] == [",".join(r[:-1]) for r in EXPECTED_ROWS]
    assert load_trace(out).recorded_admit_s == {}


@pytest.fixture
def cli(capsys):
    """``analysim ARGS`` through the real entry point: (exit code, stdout, stderr)."""
    def go(*args: str) -> tuple[int, str, str]:
        try:
            code = analysim.cli.main(list(args))
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return go


def test_simulate_and_fidelity_on_the_dump(tmp_path, cli):
    partition = tmp_path / "partition.yaml"
    partition.write_text(yaml.safe_dump(_kubectl_list(_objects())))
    trace, run = tmp_path / "trace.csv", tmp_path / "run"
    assert cli("trace", "convert", "--format", "kueue-workloads", str(WORKLOADS), "--out", str(trace))[0] == 0
    code, _, err = cli("simulate", "--trace", str(trace), "--cluster", "tiny", "--partition", str(partition),
                       "--out", str(run), "--no-plots")
    assert code == 0, err
    with (run / "jobs.csv").open() as f:
        jobs = {r["job_id"]: r for r in csv.DictReader(f)}
    # 9 CPUs of quota, 3 a job: 1, 2 and 3 admitted as created; 4 (at 120 s) when 2 ends at 300 s.
    assert {j: (r["first_start_s"], r["recorded_admit_s"]) for j, r in jobs.items()} == {
        "default/sample-job-1": ("0.0", "0.0"), "default/sample-job-2": ("0.0", "30.0"),
        "default/sample-job-3": ("60.0", "180.0"), "default/sample-job-4": ("300.0", "720.0")}
    code, out, err = cli("fidelity", str(run), "--out", str(tmp_path / "fidelity.json"))
    assert code == 0, err
    assert out.splitlines()[1].split()[:2] == ["cluster-queue", "4"]
    report = json.loads((tmp_path / "fidelity.json").read_text())
    q = report["groups"]["cluster-queue"]
    assert report["groups"]["(all)"] == q
    # Waits: simulated 0, 0, 0, 180 s; recorded 0, 30, 120, 600 s.
    sim, rec = q["simulated"], q["recorded"]
    assert q["jobs"] == 4
    assert (sim["mean_wait_s"], sim["p50_wait_s"], rec["mean_wait_s"], rec["p50_wait_s"]) == (45.0, 0.0, 187.5, 75.0)
    # p95 by linear interpolation at rank 2.85: 0 + 0.85 * 180 and 120 + 0.85 * 480.
    assert sim["p95_wait_s"] == pytest.approx(153.0) and rec["p95_wait_s"] == pytest.approx(528.0)
    assert (sim["within_1min"], rec["within_1min"], sim["within_10min"], rec["within_10min"]) == (0.75, 0.5, 1.0, 1.0)
    # The ECDFs differ most just past 0: 3/4 simulated against 1/4 recorded.
    assert q["ks_distance"] == 0.5
    if analysim.report.have_matplotlib():
        assert (tmp_path / "fidelity.png").stat().st_size > 0


def test_a_run_without_recorded_admissions_is_one_line_naming_what_is_missing(tmp_path, cli):
    run = tmp_path / "run"
    code, _, err = cli("simulate", "--jobs", "20", "--cluster", "tiny", "--out", str(run), "--no-plots")
    assert code == 0, err
    assert "recorded_admit_s" not in (run / "jobs.csv").read_text().splitlines()[0]
    code, out, err = cli("fidelity", str(run))
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "no recorded_admit_s column" in err
    code, _, err = cli("fidelity", str(tmp_path / "nowhere"))
    assert code == 2 and "no jobs.csv" in err and err.strip().count("\n") == 0


def _workloads_with(edit) -> dict:
    dump = yaml.safe_load(WORKLOADS.read_text())
    edit(dump["items"][1])
    return dump


@pytest.mark.parametrize(("edit", "message"), [
    (lambda w: w["spec"].pop("queueName"), "line 81: document 1, items[1]: spec.queueName: missing"),
    (lambda w: w["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"].update(cpu="lots"),
     "items[1]: spec.podSets[0].template.spec.containers[0].resources.requests.cpu: expected a quantity"),
    (lambda w: w["metadata"].update(creationTimestamp="yesterday"),
     "items[1]: metadata.creationTimestamp: expected a time like 2024-05-01T10:00:00Z, got 'yesterday'"),
    (lambda w: w.update(kind="Job"), "items[1]: kind: expected Workload, got 'Job'"),
    (lambda w: w["spec"]["podSets"][0].update(count=-1), "items[1]: spec.podSets[0].count: expected a whole number"),
])
def test_a_bad_workload_is_one_line_naming_the_file_line_item_and_field(tmp_path, edit, message):
    path = tmp_path / "workloads.yaml"
    path.write_text(yaml.safe_dump(_workloads_with(edit), sort_keys=False))
    with pytest.raises(UserError) as e:
        load_trace(path, "kueue-workloads")
    assert str(e.value).startswith(str(path)) and message in str(e.value) and "\n" not in str(e.value)
    json_path = tmp_path / "workloads.json"
    json_path.write_text(json.dumps(_workloads_with(edit), indent=2))
    with pytest.raises(UserError, match=r"document 1, items\[1\]"):
        load_trace(json_path, "kueue-workloads")


@pytest.mark.parametrize(("text", "message"), [
    ("apiVersion: v1\nkind: List\nitems:\n- apiVersion: kueue.x-k8s.io/v1beta2\n  kind: Workload\n  metadata: {name: w}\n",
     "line 4: document 1, items[0]: a Workload is a job's record, not part of a partition: read a Workload list as a "
     "trace (analysim trace convert --format kueue-workloads FILE --out trace.csv)"),
    ("apiVersion: v2\nkind: List\nitems: []\n", "line 1: document 1: apiVersion: a List is apiVersion v1, not 'v2'"),
    ("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: default}\n",
     "line 5: document 1, items[0]: kind: unknown kind 'Namespace'"),
    ("apiVersion: v1\nkind: List\nitems: {a: 1}\n", "line 3: document 1: items: expected a list, got a mapping"),
    ('{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",\n'
     ' "metadata": {"name": "q"}, "spec": {"clusterQueues": "x"}}]}',
     "line 2: document 1, items[0] (LocalQueue 'q'): spec.clusterQueues: unknown field"),
])
def test_a_bad_list_as_partition_is_one_line(tmp_path, text, message):
    path = tmp_path / "partition.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        read_kueue(path, TINY)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_file_level_errors_of_a_workload_list(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_trace(tmp_path / "missing.yaml", "kueue-workloads")
    (tmp_path / "empty_list.yaml").write_text("apiVersion: v1\nkind: List\nmetadata: {resourceVersion: ''}\n")
    with pytest.raises(UserError, match="no Workloads in this file"):
        load_trace(tmp_path / "empty_list.yaml", "kueue-workloads")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(UserError, match=r"no Workloads in this file \(kubectl get workloads -A -o yaml\)"):
        load_trace(tmp_path / "empty.yaml", "kueue-workloads")
    with pytest.raises(UserError, match="cannot read: Is a directory"):
        load_trace(tmp_path, "kueue-workloads")
    (tmp_path / "latin1.yaml").write_bytes(b"kind: List\nitems: [\xff]\n")
    with pytest.raises(UserError, match="not a UTF-8 text file"):
        load_trace(tmp_path / "latin1.yaml", "kueue-workloads")
    (tmp_path / "bad.json").write_text('{"kind": "List",\n "items": [}')
    with pytest.raises(UserError, match=r"bad.json, line 2: bad YAML or JSON"):
        load_trace(tmp_path / "bad.json", "kueue-workloads")


def test_fidelity_says_which_recorded_admissions_it_could_not_compare(tmp_path, cli):
    """A workload recorded as admitted that the replay refuses (or never admits) has no jobs.csv
    row: the report counts it instead of dropping it silently."""
    partition = tmp_path / "partition.yaml"
    partition.write_text(yaml.safe_dump(_kubectl_list(_objects())))
    trace, run = tmp_path / "trace.csv", tmp_path / "run"
    assert cli("trace", "convert", "--format", "kueue-workloads", str(WORKLOADS), "--out", str(trace))[0] == 0
    # A fifth workload asking for more CPU than the ClusterQueue's whole quota (9): refused here.
    with trace.open("a") as f:
        f.write("default/too-wide,0.0,600.0,0,1000,12000,600,default/user-queue,,,,60.0\n")
    code, _, err = cli("simulate", "--trace", str(trace), "--cluster", "tiny", "--partition", str(partition),
                       "--out", str(run), "--no-plots")
    assert code == 0, err
    code, out, err = cli("fidelity", str(run), "--no-plot")
    assert code == 0, err
    report = json.loads((run / "fidelity.json").read_text())
    assert report["filtered_in_replay"] == {"larger_than_queue_quota": 1} and report["unfinished_in_replay"] == 0
    assert report["groups"]["(all)"]["jobs"] == 4
    assert "1 job(s) of the trace refused by the replay (larger_than_queue_quota 1): not compared" in out
