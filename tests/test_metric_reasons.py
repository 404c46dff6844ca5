"""Every reason a refusal is counted under is one its counter exports at 0 from the start: the
reasons written in the code (the scheduler's submission, call and agent-report refusals, the
gateway's error codes) read from the source, each in the list the metrics create series for."""

from __future__ import annotations

import re
from pathlib import Path

from mlaas_monitor.metrics import REJECTION_CODES
from scheduler_svc.metrics import CALL_REFUSALS, IGNORED_REPORTS, SUBMISSION_REFUSALS

ROOT = Path(__file__).resolve().parent.parent


def _found(paths: list[str], *patterns: str) -> set[str]:
    text = "\n".join((ROOT / p).read_text() for p in paths)
    return {m for p in patterns for m in re.findall(p, text, re.S)}


def test_every_submission_refusal_reason_is_exported() -> None:
    # A job's reason is the last argument of InvalidJob / InfeasibleJob, or a Counter key of
    # the partition's filter; a journal's is JournalUnavailable's; the rest are counted by name.
    found = _found(["scheduler_svc/intake.py", "scheduler_svc/grpc_api.py", "scheduler_svc/journal.py",
                    "analysim/core/feasibility.py", "analysim/partitions/__init__.py"],
                   r'raise (?:InvalidJob|InfeasibleJob)\((?:[^()]|\([^()]*\))*?,\s*"([a-z_]+)"\)',
                   r'rejected\.labels\("([a-z_]+)"\)', r'reasons\["([a-z_]+)"\]', r'verdict = "([a-z_]+)"',
                   r'reason = "([a-z_]+)" if full else "([a-z_]+)"')
    found = {r for f in found for r in ([f] if isinstance(f, str) else f)}
    assert found == set(SUBMISSION_REFUSALS), found ^ set(SUBMISSION_REFUSALS)


def test_every_call_and_report_refusal_reason_is_exported() -> None:
    calls = _found(["scheduler_svc/auth.py", "scheduler_svc/grpc_api.py"], r'refused(?:_calls\.labels)?\("([a-z_]+)"\)')
    assert calls == set(CALL_REFUSALS), calls
    reports = _found(["scheduler_svc/agents.py"], r'agent_events\.labels\("([a-z_]+)"\)', r'"(unknown_job|stale_launch)"')
    assert reports == set(IGNORED_REPORTS), reports ^ set(IGNORED_REPORTS)


def test_every_gateway_error_code_is_exported() -> None:
    # The codes are exactly the list: one the code no longer answers with is not exported either.
    # (the monitor's own codes too: its admin routes answer through the gateway's forward)
    paths = [str(p.relative_to(ROOT)) for p in (ROOT / "mlaas_monitor").rglob("*.py")]
    codes = _found(paths, r'ApiError\(\s*\d{3},\s*"([a-z_]+)"', r'super\(\).__init__\(\d{3}, "([a-z_]+)"',
                   r'bad_field\((?:[^()]|\([^()]*\))*?,\s*"([a-z_]+)"\)', r'\d{3}: "([a-z_]+)"',
                   r'\.get\(e\.status, "([a-z_]+)"\)')
    codes.discard("client_closed")  # the client's doing, counted as a 499 request, not a rejection
    assert codes == set(REJECTION_CODES), codes ^ set(REJECTION_CODES)
