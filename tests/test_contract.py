"""scheduler_svc.contract: the analysim.v1 enums to and from the service's words, jobs with
times not reached yet, and the run summary through a Struct."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysim._protos.v1 import scheduler_pb2 as spb
from analysim.core.job import JobStatus as CoreStatus
from scheduler_svc.contract import job_proto, summary_dict, summary_struct, value, word


@pytest.mark.parametrize("enum", [spb.JobStatus, spb.JobSource, spb.EventKind])
def test_every_enum_value_round_trips_through_its_word(enum) -> None:  # noqa: ANN001
    for v in enum.values():
        assert value(enum, word(enum, v)) == v
    with pytest.raises(ValueError, match="is not one of"):
        value(enum, "no-such-word")


def test_the_core_statuses_and_decisions_have_values() -> None:
    assert {value(spb.JobStatus, s.value) for s in CoreStatus} >= {spb.JOB_STATUS_PENDING, spb.JOB_STATUS_COMPLETED}
    for kind in ("launch", "preempt", "migrate", "complete", "requeue", "cancel", "fail", "resume"):
        assert value(spb.EventKind, kind)


def test_times_not_reached_are_unset() -> None:
    job = job_proto({"job_id": "a", "status": "pending", "submit_s": 5.0, "first_start_s": None, "end_s": math.nan,
                     "source": "client"})
    assert not job.HasField("first_start_s") and not job.HasField("end_s")
    assert (job.status, job.source, job.submit_s) == (spb.JOB_STATUS_PENDING, spb.JOB_SOURCE_CLIENT, 5.0)
    done = job_proto({"job_id": "b", "status": "completed", "first_start_s": 0.0, "end_s": 7.5})
    assert done.HasField("first_start_s") and (done.first_start_s, done.end_s) == (0.0, 7.5)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**52, 2**52) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_a_summary_survives_the_struct(summary: dict) -> None:
    back = summary_dict(summary_struct(summary))
    assert back == summary  # equal as numbers (a whole float comes back as an int)
    assert all(type(back[k]) is int for k, v in summary.items() if type(v) is int)  # a count stays a count
