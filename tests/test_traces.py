"""Trace readers, the canonical format and format detection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysim.core.job import MAX_TIME_S, JobSpec
from analysim.errors import InputFileError, UserError
from analysim.traces import FORMATS, Trace, detect_format, load_trace, write_canonical
from analysim.traces import synthetic as syn
from analysim.traces.synthetic import generate
from tests.shared import TRACES, needs_shared

DATA = Path(__file__).resolve().parent / "data"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# --- philly ----------------------------------------------------------------------------------------


def test_philly_sorted_relative_and_named_by_row():
    t = load_trace(DATA / "philly_small.csv", "philly")
    assert t.format == "philly" and t.filtered == {}
    # philly-1 and philly-3 share a timestamp: file order breaks the tie
    assert [j.job_id for j in t.jobs] == ["philly-2", "philly-1", "philly-3", "philly-0", "philly-4"]
    first, second = t.jobs[0], t.jobs[1]
    assert first.submit_s == 0.0 and first.num_gpus == 8 and first.vc == "6c71a0"
    assert second.submit_s == 9 * 86400 + 22 * 3600 + 14 * 60 + 31
    assert first.duration_s == 860662.0 and first.user == "" and first.gpu_milli == 1000
    # naive clock: no daylight-saving hour appears between 2017-09-29 and 2017-11-05
    assert t.jobs[-1].submit_s == (37 * 86400) + (12 * 3600) - (7 * 3600 + 58 * 60 + 32)


@needs_shared(TRACES / "philly.csv")
def test_philly_real_file():
    t = load_trace(TRACES / "philly.csv", "philly")  # (how fast: bench/bench_trace_load.py)
    assert len(t.jobs) == 82247 and t.filtered == {}
    assert len({j.vc for j in t.jobs}) == 15
    assert Counter(j.num_gpus for j in t.jobs) == {
        1: 76627, 2: 1818, 4: 1870, 8: 1643, 12: 7, 16: 199, 24: 7, 32: 67, 64: 6, 128: 3
    }  # fmt: skip
    assert t.jobs[0].submit_s == 0.0
    assert all(a.submit_s <= b.submit_s for a, b in zip(t.jobs, t.jobs[1:], strict=False))


@needs_shared(TRACES / "philly.csv")
def test_philly_round_trips_through_canonical(tmp_path):
    t = load_trace(TRACES / "philly.csv", "philly")
    write_canonical(t, tmp_path / "p.csv")
    assert load_trace(tmp_path / "p.csv").jobs == t.jobs


# --- openb -----------------------------------------------------------------------------------------


def test_openb_filters_are_counted_and_shares_kept():
    t = load_trace(DATA / "openb_small.csv", "openb")
    assert [j.job_id for j in t.jobs] == [
        "openb-pod-0000",
        "openb-pod-0001",
        "openb-pod-0002",
        "openb-pod-0003",
        "openb-pod-0005",
    ]
    assert t.filtered == {"never_scheduled": 1, "deleted_before_scheduled": 1}
    by_id = {j.job_id: j for j in t.jobs}
    cpu = by_id["openb-pod-0003"]  # kept: it takes CPU and memory on a GPU node
    assert cpu.num_gpus == 0 and cpu.gpu_demand == 0 and cpu.cpu_milli > 0
    dropped = load_trace(DATA / "openb_small.csv", "openb", drop_cpu_only=True)
    assert dropped.jobs == [j for j in t.jobs if j.num_gpus]
    assert dropped.filtered == {"never_scheduled": 1, "deleted_before_scheduled": 1, "cpu_only": 1}
    shared = by_id["openb-pod-0001"]
    assert shared.is_fractional and shared.gpu_milli == 460 and shared.qos == "LS"
    assert shared.submit_s == 427061.0 and shared.duration_s == 12902960 - 427061
    big = by_id["openb-pod-0002"]
    assert big.gpu_models == ("V100M16", "V100M32") and big.duration_s == 99900.0
    assert big.cpu_milli == 88000 and big.memory_mib == 327680
    assert by_id["openb-pod-0005"].gpu_milli == 1000  # multi-GPU pods use whole GPUs


def test_openb_inflate_form_has_no_times():
    t = load_trace(DATA / "openb_inflate_small.csv")
    assert t.format == "openb" and t.filtered == {}
    assert [j.duration_s for j in t.jobs] == [None] * 4
    assert {j.submit_s for j in t.jobs} == {0.0}
    assert [j.job_id for j in t.jobs] == ["openb-pod-0000", "openb-pod-0001", "openb-pod-0002", "openb-pod-0003"]
    assert [j.num_gpus == 0 for j in t.jobs] == [False, False, True, False]


@needs_shared(TRACES / "openb_pod_list_default.csv", TRACES / "openb_pod_list_multigpu50.csv")
def test_openb_real_files():
    t = load_trace(TRACES / "openb_pod_list_default.csv", "openb", drop_cpu_only=True)
    # 1,088 CPU-only pods, 36 of them never scheduled (counted as such).
    assert len(t.jobs) == 8152 - 1052 - 897
    assert t.filtered == {"cpu_only": 1052, "never_scheduled": 897}
    assert Counter(j.num_gpus for j in t.jobs) == {1: 6129, 2: 15, 4: 15, 8: 44}
    kept = load_trace(TRACES / "openb_pod_list_default.csv", "openb")
    assert kept.filtered == {"never_scheduled": 897} and sum(j.num_gpus == 0 for j in kept.jobs) == 1052
    m = load_trace(TRACES / "openb_pod_list_multigpu50.csv", drop_cpu_only=True)
    assert len(m.jobs) == 9061 - 1088 and m.filtered == {"cpu_only": 1088}
    assert len(load_trace(TRACES / "openb_pod_list_multigpu50.csv").jobs) == 9061
    assert sum(j.is_fractional for j in m.jobs) == 3078


def test_openb_partial_time_columns(tmp_path):
    p = write(tmp_path, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time\np,1,1,1,1000,0\n")
    with pytest.raises(InputFileError, match="deletion_time, scheduled_time"):
        load_trace(p, "openb")


# --- helios ----------------------------------------------------------------------------------------


def test_helios_reader():
    t = load_trace(DATA / "helios_small.csv")
    assert t.format == "helios"
    assert t.filtered == {"cpu_only": 1, "never_started": 1}
    assert [(j.job_id, j.submit_s) for j in t.jobs] == [("4378", 0.0), ("4374", 72.0), ("4375", 120.0)]
    j = t.jobs[2]
    assert (j.num_gpus, j.cpu_milli, j.duration_s, j.vc, j.user) == (8, 48000, 3600.0, "vcHcQ", "uXyz")


# --- canonical -------------------------------------------------------------------------------------


def test_canonical_reader():
    t = load_trace(DATA / "canonical_small.csv")
    assert t.format == "canonical"
    assert t.jobs[1] == JobSpec("j2", 10.5, None, 1, 250, 2000, 8192, "prod", "bob", ("T4", "A10"), "LS")
    assert t.jobs[2].duration_s == 0.1 and t.jobs[2].gpu_models == ("V100",)


def test_canonical_optional_columns_default(tmp_path):
    p = write(tmp_path, "job_id,submit_s,duration_s,num_gpus\na,1,,2\n")
    assert load_trace(p).jobs == [JobSpec("a", 1.0, None, 2)]


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("job_id,submit_s,duration_s,num_gpus,extra\na,1,2,1,x\n", 1, None, "unknown column"),
        ("job_id,submit_s,duration_s,num_gpus\na,1,2,1\na,2,2,1\n", 3, "job_id", "duplicate job id"),
        ("job_id,submit_s,duration_s,num_gpus\n,1,2,1\n", 2, "job_id", "empty job id"),
        ("job_id,submit_s,duration_s,num_gpus,gpu_milli\na,1,2,1,0\n", 2, "gpu_milli", "1 to 1000"),
        ("job_id,submit_s,duration_s,num_gpus,gpu_milli\na,1,2,1,1001\n", 2, "gpu_milli", "1 to 1000"),
        ("job_id,submit_s,duration_s,num_gpus\na,-1,2,1\n", 2, "submit_s", "at least 0"),
        ("job_id,submit_s,duration_s,num_gpus\na,1,nan,1\n", 2, "duration_s", "finite"),
        (
            "job_id,submit_s,duration_s,num_gpus,gpu_models\na,1,2,1,A||B\n",
            2,
            "gpu_models",
            "empty GPU model",
        ),
    ],
)
def test_canonical_bad_rows(tmp_path, text, line, column, words):
    with pytest.raises(InputFileError, match=words) as e:
        load_trace(write(tmp_path, text), "canonical")
    assert (e.value.line, e.value.column) == (line, column)


_names = st.text(max_size=8)
_models = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="|"), min_size=1, max_size=6),
    max_size=3,
)
_finite = st.floats(min_value=0.0, max_value=MAX_TIME_S, allow_nan=False, allow_infinity=False)
_jobs = st.builds(
    JobSpec,
    job_id=st.text(min_size=1, max_size=12),
    submit_s=_finite,
    duration_s=st.none() | _finite,
    num_gpus=st.integers(0, 512),
    gpu_milli=st.integers(1, 1000),
    cpu_milli=st.integers(0, 10**9),
    memory_mib=st.integers(0, 10**9),
    vc=_names,
    user=_names,
    gpu_models=_models.map(tuple),
    qos=_names,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_jobs, max_size=12, unique_by=lambda j: j.job_id))
def test_canonical_round_trip_is_exact(tmp_path_factory, jobs):
    path = tmp_path_factory.getbasetemp() / "round_trip.csv"  # overwritten by every example
    jobs.sort(key=lambda j: j.submit_s)
    write_canonical(Trace(jobs, "x", "canonical"), path)
    back = load_trace(path, "canonical")
    assert back.jobs == jobs
    assert [repr(j.submit_s) for j in back.jobs] == [repr(float(j.submit_s)) for j in jobs]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_jobs, st.none() | _finite), max_size=12, unique_by=lambda jr: jr[0].job_id))
def test_canonical_round_trip_keeps_recorded_admissions(tmp_path_factory, drawn):
    """Recorded admissions (any subset of the jobs) read back exactly; a trace without any writes
    the file it always wrote, with no recorded_admit_s column."""
    path = tmp_path_factory.getbasetemp() / "round_trip_recorded.csv"  # overwritten by every example
    jobs = sorted((j for j, _ in drawn), key=lambda j: j.submit_s)
    recorded = {j.job_id: t for j, t in drawn if t is not None}
    write_canonical(Trace(jobs, "x", "canonical", recorded_admit_s=recorded), path)
    back = load_trace(path, "canonical")
    assert (back.jobs, back.recorded_admit_s) == (jobs, recorded)
    assert ("recorded_admit_s" in path.read_text(encoding="utf-8").split("\n", 1)[0]) == bool(recorded)


def test_write_canonical_refuses_unreadable_jobs(tmp_path):
    for bad in (
        JobSpec("a", float("inf"), 1.0, 1),
        JobSpec("a", 0.0, 1.0, 1, gpu_models=("A|B",)),
        JobSpec("", 0.0, 1.0, 1),
        JobSpec("a", 0.0, 1.0, 1, user="\ud800"),
    ):
        with pytest.raises(UserError):
            write_canonical(Trace([bad], "x", "canonical"), tmp_path / "o.csv")


# --- format detection and bad input common to all readers -----------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("philly_small.csv", "philly"),
        ("openb_small.csv", "openb"),
        ("openb_inflate_small.csv", "openb"),
        ("helios_small.csv", "helios"),
        ("canonical_small.csv", "canonical"),
    ],
)
def test_detect_format(name, fmt):
    assert detect_format(DATA / name) == fmt


def test_detect_refuses_node_list_and_unknown(tmp_path):
    with pytest.raises(UserError, match="node list"):
        load_trace(DATA / "openb_nodes_small.csv")
    with pytest.raises(UserError, match="cannot tell"):
        load_trace(write(tmp_path, "a,b\n1,2\n"))
    with pytest.raises(UserError, match="unknown trace format"):
        load_trace(DATA / "philly_small.csv", "alibaba")


PHILLY_H = "timestamp,duration,num_gpus,gpu_time,cluster\n"
OPENB_H = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
HELIOS_H = "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
GOOD = {
    "philly": "2017-10-09 07:01:55,66.0,1,66.0,a\n",
    "openb": "p0,1000,1024,1,500,,LS,Running,0,10,0\n",
    "helios": "1,u,vc,1,4,1,COMPLETED,2020-04-01 00:00:12,2020-04-01 00:00:13,2020-04-01 00:09:45,572,1\n",
}
HEADERS = {"philly": PHILLY_H, "openb": OPENB_H, "helios": HELIOS_H}


@pytest.mark.parametrize(
    ("fmt", "row", "column"),
    [
        ("philly", "2017-10-09 7:01:55,66.0,1,66.0,a", "timestamp"),
        ("philly", "2017-13-09 07:01:55,66.0,1,66.0,a", "timestamp"),
        ("philly", "2017-10-09 07:01:55,abc,1,66.0,a", "duration"),
        ("philly", "2017-10-09 07:01:55,-5,1,66.0,a", "duration"),
        ("philly", "2017-10-09 07:01:55,inf,1,66.0,a", "duration"),
        ("philly", "2017-10-09 07:01:55,66.0,1.5,66.0,a", "num_gpus"),
        ("philly", "2017-10-09 07:01:55,66.0,-1,66.0,a", "num_gpus"),
        ("openb", "p1,x,1024,1,500,,LS,Running,0,10,0", "cpu_milli"),
        ("openb", "p1,1000,-1,1,500,,LS,Running,0,10,0", "memory_mib"),
        ("openb", "p1,1000,1024,one,500,,LS,Running,0,10,0", "num_gpu"),
        ("openb", "p1,1000,1024,1,0,,LS,Running,0,10,0", "gpu_milli"),
        ("openb", "p1,1000,1024,1,1500,,LS,Running,0,10,0", "gpu_milli"),
        ("openb", "p1,1000,1024,1,500,A||B,LS,Running,0,10,0", "gpu_spec"),
        ("openb", "p1,1000,1024,1,500,,LS,Running,,10,0", "creation_time"),
        ("openb", "p1,1000,1024,1,500,,LS,Running,0,,0", "deletion_time"),
        ("openb", "p1,1000,1024,1,500,,LS,Running,0,10,soon", "scheduled_time"),
        ("helios", "2,u,vc,x,4,1,COMPLETED,2020-04-01 00:00:12,2020-04-01 00:00:13,,572,1", "gpu_num"),
        ("helios", "2,u,vc,1,4,1,COMPLETED,04/01/2020,2020-04-01 00:00:13,,572,1", "submit_time"),
        ("helios", "2,u,vc,1,4,1,COMPLETED,2020-04-01 00:00:12,yesterday,,572,1", "start_time"),
        ("helios", "2,u,vc,1,four,1,COMPLETED,2020-04-01 00:00:12,2020-04-01 00:00:13,,572,1", "cpu_num"),
        ("helios", "2,u,vc,1,4,1,COMPLETED,2020-04-01 00:00:12,2020-04-01 00:00:13,,-3,1", "duration"),
    ],
)
def test_malformed_rows_name_line_and_column(tmp_path, fmt, row, column):
    # good row on line 2, a blank line 3 (skipped), the bad row on line 4
    p = write(tmp_path, HEADERS[fmt] + GOOD[fmt] + "\n" + row + "\n")
    with pytest.raises(InputFileError) as e:
        load_trace(p, fmt)
    assert (e.value.line, e.value.column) == (4, column)
    assert str(e.value).startswith(f"{p}, line 4, column {column!r}: ")


@pytest.mark.parametrize("fmt", ["philly", "openb", "helios"])
def test_wrong_field_count(tmp_path, fmt):
    p = write(tmp_path, HEADERS[fmt] + GOOD[fmt] + GOOD[fmt].rstrip("\n") + ",extra\n")
    with pytest.raises(InputFileError, match="expected .* fields") as e:
        load_trace(p, fmt)
    assert e.value.line == 3


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "kueue-workloads"])  # (CSVs: tests/test_kueue_kubectl.py has its)
def test_file_level_errors(tmp_path, fmt):
    with pytest.raises(UserError, match="no such file"):
        load_trace(tmp_path / "missing.csv", fmt)
    with pytest.raises(UserError, match="empty file"):
        load_trace(write(tmp_path, ""), fmt)
    with pytest.raises(UserError, match="is a directory"):
        load_trace(tmp_path, fmt)
    with pytest.raises(InputFileError, match="missing column") as e:
        load_trace(write(tmp_path, "foo,bar\n1,2\n"), fmt)
    assert e.value.line == 1
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(HEADERS.get(fmt, "job_id,submit_s,duration_s,num_gpus\n").encode() + b"\xff\xfe,1\n")
    with pytest.raises(UserError, match="UTF-8"):
        load_trace(bad, fmt)


@pytest.mark.parametrize("fmt", ["philly", "openb", "helios"])
def test_header_only_and_bom(tmp_path, fmt):
    assert load_trace(write(tmp_path, HEADERS[fmt]), fmt).jobs == []
    p = tmp_path / "bom.csv"
    p.write_text("\ufeff" + HEADERS[fmt] + GOOD[fmt], encoding="utf-8")
    assert len(load_trace(p).jobs) == 1


def test_duplicate_header_column(tmp_path):
    with pytest.raises(InputFileError, match="duplicate column"):
        load_trace(write(tmp_path, "timestamp,duration,num_gpus,cluster,cluster\n"), "philly")


# --- synthetic generator ---------------------------------------------------------------------------


def test_synthetic_is_deterministic_and_extends():
    a = generate(800, 7)
    assert a.jobs == generate(800, 7).jobs
    assert a.jobs != generate(800, 8).jobs
    assert generate(300, 7).jobs == a.jobs[:300]  # more jobs extend the same trace
    assert a.format == "synthetic" and a.filtered == {}
    assert all(x.submit_s <= y.submit_s for x, y in zip(a.jobs, a.jobs[1:], strict=False))
    assert len({j.job_id for j in a.jobs}) == 800
    j = a.jobs[0]
    assert (
        j.cpu_milli == j.num_gpus * syn.CPU_MILLI_PER_GPU
        and j.memory_mib == j.num_gpus * syn.MEMORY_MIB_PER_GPU
    )


def test_synthetic_edge_arguments():
    assert generate(0, 1).jobs == []
    with pytest.raises(UserError):
        generate(-1, 1)
    with pytest.raises(UserError):
        generate(10, 1, rate_scale=0)


def test_synthetic_reads_no_files(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the generator must not read files")

    monkeypatch.setattr("builtins.open", refuse)
    monkeypatch.setattr(Path, "open", refuse)
    assert len(generate(100, 3).jobs) == 100


def test_synthetic_rate_scale_stretches_time():
    full, quarter = generate(4000, 5), generate(4000, 5, rate_scale=0.25)
    ratio = quarter.jobs[-1].submit_s / full.jobs[-1].submit_s
    assert 2.5 < ratio < 6


@pytest.fixture(scope="module")
def big_sample():
    jobs = generate(100_000, 2024).jobs
    return (
        np.array([j.submit_s for j in jobs]),
        np.array([j.num_gpus for j in jobs]),
        np.array([j.duration_s for j in jobs]),
        [j.vc for j in jobs],
    )


def test_synthetic_marginals_match_the_fit(big_sample):
    submit, gpus, duration, vcs = big_sample
    n = gpus.size
    total = sum(syn.GPU_COUNT_JOBS.values())
    for g, count in syn.GPU_COUNT_JOBS.items():
        assert abs((gpus == g).mean() - count / total) < 0.004, g
    vc_jobs = np.sum(syn.VC_JOBS_BY_CLASS, axis=0)
    got = Counter(vcs)
    for vc, count in zip(syn.VCS, vc_jobs, strict=True):
        assert abs(got[vc] / n - count / vc_jobs.sum()) < 0.012, vc
    # Duration quantile function per GPU-count class: at each knot, the share of jobs below it is the
    # knot's level (bracketed by +-0.5 s because durations are rounded to whole seconds).
    cls = syn.gpu_class(gpus)
    for c, q in enumerate(syn.DURATION_QUANTILES):
        d = duration[cls == c]
        tol = 4 * np.sqrt(0.25 / d.size)
        for level in (0.1, 0.25, 0.5, 0.75, 0.9):
            knot = q[syn.QUANTILE_LEVELS.index(level)]
            assert (d <= knot - 0.5).mean() - tol <= level <= (d <= knot + 0.5).mean() + tol, (c, level)
    days = submit[-1] / 86400
    assert abs(n / days / syn.MEAN_JOBS_PER_DAY - 1) < 0.2
    busy_gpus = (gpus * duration).sum() / submit[-1]
    assert 300 < busy_gpus < 450  # the extract averages ~374


def test_synthetic_arrival_shape(big_sample):
    submit = big_sample[0]
    hours = np.bincount(((submit % 86400) // 3600).astype(int), minlength=24)
    assert np.corrcoef(hours, syn.HOUR_WEIGHTS)[0, 1] > 0.9
    weekday = np.bincount(((submit // 86400) % 7).astype(int), minlength=7)
    assert weekday[5:].mean() < 0.7 * weekday[:5].mean()  # quiet weekends
    # about 15% of Philly's jobs share their submit second with another (sweeps)
    _, counts = np.unique(submit, return_counts=True)
    assert 0.11 < counts[counts > 1].sum() / submit.size < 0.19


@needs_shared(TRACES / "philly.csv")
def test_synthetic_constants_match_philly():
    t = load_trace(TRACES / "philly.csv", "philly")
    assert Counter(j.num_gpus for j in t.jobs) == syn.GPU_COUNT_JOBS
    vc_jobs = Counter(j.vc for j in t.jobs)
    assert {
        vc: int(n) for vc, n in zip(syn.VCS, np.sum(syn.VC_JOBS_BY_CLASS, axis=0), strict=True)
    } == vc_jobs
    span_days = t.jobs[-1].submit_s / 86400
    assert abs(syn.MEAN_JOBS_PER_DAY - len(t.jobs) / span_days) < 0.01
    d = np.array([j.duration_s for j in t.jobs if j.num_gpus == 1])
    assert np.median(d) == syn.DURATION_QUANTILES[0][syn.QUANTILE_LEVELS.index(0.5)]


def test_broken_csv_is_reported_with_its_line(tmp_path):
    p = write(tmp_path, PHILLY_H + GOOD["philly"] + "2017-10-09 07:01:55,66.0,1,66.0," + "x" * 200_000 + "\n")
    with pytest.raises(InputFileError, match="bad CSV") as e:
        load_trace(p, "philly")
    assert e.value.line == 3
