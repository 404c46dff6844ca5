"""Reading and writing as a stream: ``--limit`` stops reading a sorted trace, jobs enter the engine
as the clock reaches them, jobs.csv is written while the run goes — and none of it changes a result."""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysim.core.engine import Engine, EngineConfig
from analysim.core.job import JobSpec
from analysim.core.metrics import JOB_FIELDS, MetricsRecorder
from analysim.core.policies import build_policy
from analysim.errors import InputFileError
from analysim.report import JobsCsv, write_csv, write_run
from analysim.simulation import RunOptions, run
from analysim.traces import generate, load_trace, write_canonical
from analysim.traces.base import Trace
from analysim.traces.summary import summarize, summarize_file
from tests.simhelpers import cluster
from tests.test_simulate_cli import analysim

# Per format: a header, a row maker (i-th job, submitted at second t), and a row no reader accepts.
FORMATS = {
    "canonical": ("job_id,submit_s,duration_s,num_gpus\n", lambda i, t: f"j{i},{t},60,1", "j9,soon,60,1"),
    "philly": ("timestamp,duration,num_gpus,gpu_time,cluster\n",
               lambda i, t: f"2017-10-01 00:{t // 60:02d}:{t % 60:02d},60,1,60,vc1", "yesterday,60,1,60,vc1"),
    "helios": ("job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n",
               lambda i, t: f"{i},u,vc1,1,4,1,COMPLETED,2020-04-01 00:00:{t:02d},2020-04-01 00:00:{t:02d},,60,0",
               "9,u,vc1,many,4,1,COMPLETED,,,,60,0"),
    "openb": ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time\n", lambda i, t: f"p{i},1000,1024,1,1000,,LS,Running,{t},{t + 60},{t}",
              "p9,1000,1024,x,1000,,LS,Running,0,60,0"),
}  # fmt: skip


def trace_file(tmp_path: Path, fmt: str, times: list[int], tail: str = "") -> Path:
    header, row, _ = FORMATS[fmt]
    p = tmp_path / f"{fmt}.csv"
    p.write_text(header + "".join(row(i, t) + "\n" for i, t in enumerate(times)) + tail, encoding="utf-8")
    return p


@pytest.mark.parametrize("fmt", FORMATS)
def test_limit_stops_reading_a_sorted_file(tmp_path, fmt):
    # Rows past the limit are not read: a garbage row there goes unnoticed, as the docs say.
    bad = FORMATS[fmt][2]
    p = trace_file(tmp_path, fmt, [0, 5, 5, 9], tail=bad + "\n")
    with pytest.raises(InputFileError) as e:
        load_trace(p, fmt)
    assert e.value.line == 6
    limited = load_trace(p, fmt, limit=3)
    assert [j.submit_s for j in limited.jobs] == [0.0, 5.0, 5.0]
    full = load_trace(trace_file(tmp_path, fmt, [0, 5, 5, 9]), fmt)
    assert limited.jobs == full.jobs[:3]


@pytest.mark.parametrize("fmt", FORMATS)
def test_limit_on_a_file_out_of_order_reads_it_all(tmp_path, fmt):
    # The third row comes before the second, within the limit: reading falls back to the whole
    # file, so the first jobs by submit time are still the ones taken, and an error anywhere in the
    # file is reported.
    times = [0, 9, 4, 2, 7]
    p = trace_file(tmp_path, fmt, times)
    assert load_trace(p, fmt, limit=3).jobs == load_trace(p, fmt).jobs[:3]
    assert [j.submit_s for j in load_trace(p, fmt, limit=3).jobs] == [0.0, 2.0, 4.0]
    with pytest.raises(InputFileError) as e:
        load_trace(trace_file(tmp_path, fmt, times, tail=FORMATS[fmt][2] + "\n"), fmt, limit=3)
    assert e.value.line == 7
    # Disorder past the limit is not seen (those rows are not read): the file is taken as sorted.
    assert [j.submit_s for j in load_trace(p, fmt, limit=2).jobs] == [0.0, 9.0]


def test_simulate_limit_reads_no_further(tmp_path):
    p = trace_file(tmp_path, "canonical", list(range(0, 50, 5)), tail="j99,1e99,60,1\n")
    r = analysim("simulate", "--trace", str(p), "--limit", "4", "--cluster", "1x8", "--no-plots", "--out",
                 str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len((tmp_path / "out" / "jobs.csv").read_text().splitlines()) == 1 + 4
    r = analysim("simulate", "--trace", str(p), "--cluster", "1x8", "--no-plots", "--out", str(tmp_path / "o2"),
                 cwd=tmp_path)
    assert r.returncode == 2 and "line 12, column 'submit_s'" in r.stderr and "Traceback" not in r.stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(times=st.lists(st.integers(0, 30), min_size=1, max_size=25), limit=st.integers(1, 30),
       sort=st.booleans())
def test_limit_is_the_first_jobs_of_the_whole_file(tmp_path, times, limit, sort):
    p = trace_file(tmp_path, "canonical", sorted(times) if sort else times)
    times = sorted(times) if sort else times
    limited, full = load_trace(p, limit=limit).jobs, load_trace(p).jobs
    if all(a <= b for a, b in pairwise(times[:limit])):
        # In order up to the limit: the first rows, read no further...
        assert [j.job_id for j in limited] == [f"j{i}" for i in range(min(limit, len(times)))]
        if all(t >= times[:limit][-1] for t in times[limit:]):
            assert limited == full[:limit]  # ...which are the first jobs when the rest is not earlier
    else:  # out of order before the limit: the whole file was read
        assert limited == full[:limit]


def test_duplicate_ids_are_found_with_their_lines(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("job_id,submit_s,duration_s,num_gpus\na,0,1,1\nb,1,1,1\na,2,1,1\n")
    with pytest.raises(InputFileError, match=r"line 4, column 'job_id': duplicate job id 'a' \(first on line 2\)"):
        load_trace(p)
    assert len(load_trace(p, limit=2).jobs) == 2  # the repeat is past the limit
    p.write_text("job_id,submit_s,duration_s,num_gpus\na,0,1,0\nb,1,1,1\na,2,1,1\n")  # a CPU-only 'a' first
    with pytest.raises(InputFileError, match="duplicate job id 'a'"):
        load_trace(p, drop_cpu_only=True)


def test_synthetic_limit_makes_the_first_jobs_only():
    assert generate(900, seed=4, limit=250).jobs == generate(900, seed=4).jobs[:250]


def test_trace_info_summary_of_a_file_is_that_of_the_loaded_trace(tmp_path):
    p = tmp_path / "s.csv"
    trace = generate(3000, seed=2)
    shuffled = trace.jobs[1::2] + trace.jobs[::2]  # not in submit order: sums must not care
    write_canonical(Trace(shuffled, "x", "canonical"), p)
    assert summarize_file(p) == summarize(load_trace(p))


# --- a run that streams its jobs.csv and forgets its ended jobs ----------------------------------


@st.composite
def small_run(draw):
    n = draw(st.integers(1, 30))
    jobs = [JobSpec(f"j{draw(st.integers(0, 99)):02d}-{i}", float(draw(st.integers(0, 300))),
                    float(draw(st.integers(1, 400))), draw(st.sampled_from([1, 1, 2, 4, 8])),
                    vc=draw(st.sampled_from(["a", "b"]))) for i in range(n)]
    if draw(st.booleans()):
        jobs.sort(key=lambda j: j.submit_s)
    opts = RunOptions(policy=draw(st.sampled_from(["fifo", "sjf", "srtf", "tiresias", "fair"])),
                      preemption=draw(st.booleans()), migration=draw(st.booleans()), sample_points=20)
    return jobs, opts


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(small_run())
def test_streamed_jobs_csv_and_summary_are_those_of_a_kept_run(tmp_path, sc):
    jobs, opts = sc
    spec = cluster(2, 8)
    kept = run(jobs, spec, opts)
    write_run(tmp_path / "kept", kept.summary, kept.jobs, kept.timeseries, plots=False)
    (tmp_path / "streamed").mkdir(exist_ok=True)
    with JobsCsv(tmp_path / "streamed" / "jobs.csv") as sink:
        streamed = run(jobs, spec, opts, job_sink=sink)
    assert sink.waiting() == 0 and streamed.jobs == [] and streamed.decisions == []
    assert (tmp_path / "streamed" / "jobs.csv").read_bytes() == (tmp_path / "kept" / "jobs.csv").read_bytes()
    assert streamed.summary == kept.summary
    assert streamed.completed_jct.tolist() == [j["jct_s"] for j in kept.jobs if j["status"] == "completed"]


def test_a_failed_run_leaves_no_jobs_csv(tmp_path):
    with pytest.raises(ValueError), JobsCsv(tmp_path / "jobs.csv") as sink:
        run([JobSpec("a", 0.0, 5.0, 1), JobSpec("a", 1.0, 5.0, 1)], cluster(1, 8), RunOptions(), job_sink=sink)
    assert list(tmp_path.iterdir()) == []


@settings(max_examples=30, deadline=None)
@given(small_run())
def test_fed_jobs_run_as_if_submitted_first(sc):
    jobs, opts = sc
    jobs = sorted(jobs, key=lambda j: j.submit_s)
    jobs = list({j.job_id: j for j in jobs}.values())

    def engine(config: EngineConfig) -> Engine:
        return Engine(cluster(2, 8), build_policy(opts.policy, opts.placement), config,
                      recorder=MetricsRecorder(sample_interval_s=50.0), workload=jobs)

    first = engine(opts.engine_config())
    for j in jobs:
        first.submit(j)
    first.run()
    fed = engine(dataclasses.replace(opts.engine_config(), keep_ended=False))
    fed.feed(jobs)
    fed.run()
    assert fed.decisions == first.decisions
    assert fed.recorder.jobs == first.recorder.jobs and fed.recorder.samples == first.recorder.samples
    assert fed.recorder.summary(fed) == first.recorder.summary(first)
    assert not fed.jobs and fed.forgotten_jobs == len(jobs)


_CELLS = st.one_of(st.none(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                   st.text(alphabet="ainf,\"\n\r x|0", max_size=8))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({k: _CELLS for k in JOB_FIELDS if k not in ("job_id", "submit_s")}), max_size=8),
       st.data())
def test_jobs_csv_rows_are_those_write_csv_writes(tmp_path, rows, data):
    # Whatever a cell holds (None, an infinite or NaN float, text with commas, quotes, line
    # breaks or the letters of "inf"), a streamed row is the bytes write_run's table has.
    rows = [{"job_id": data.draw(st.text(alphabet="inf,\"ab", max_size=5)) + f"#{i}",
             "submit_s": float(data.draw(st.integers(0, 5))), **r} for i, r in enumerate(rows)]
    rows.sort(key=lambda r: (r["submit_s"], r["job_id"]))
    write_csv(rows, tmp_path / "kept.csv", JOB_FIELDS)
    with JobsCsv(tmp_path / "streamed.csv") as sink:
        for r in rows:
            sink.write(r)
    assert (tmp_path / "streamed.csv").read_bytes() == (tmp_path / "kept.csv").read_bytes()
