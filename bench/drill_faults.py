#!/usr/bin/env python3
"""Reliability drill: the faults of docs/reliability.md injected into real processes, and what was lost.

1. Stall drill: a lockstep replay (--jobs jobs of the synthetic trace, 16x8, two agents) in
   which one agent is frozen with SIGSTOP past the heartbeat deadline and thawed with SIGCONT,
   --stalls times; the same agent process must come back each time and the replay finish with
   every job accounted for; then a client submits jobs, the scheduler is SIGKILLed and
   restarted on its journal, and every acknowledged job must be there.
2. The fault tests (one per fault, each against real processes, files and signals): poison
   query-log rows, a monitor that cannot read the log, a killed monitor child, a full disk
   under the journal, damaged journals (truncated, flipped bytes, WAL bytes, empty), a large
   broken model row, a store missing its ledger, a flood of agent reports, malformed
   protobuf and hostile ids, token rotation and SIGHUP, slow uploads, bounded latencies.
3. The second round's gateway fault tests (G1-G7): stores damaged under their metadata,
   model rows out of range, poison in every query-log column, a full disk under the store,
   a frozen monitor child, idle connections, mis-encoded bodies, a trickling admin body,
   names with a newline, a log flood, a test timing out with its processes running, the
   suite's image pruning, damaged answers behind idempotency keys, rejection counters at 0.

4. The scheduler's second round: a journal drill (client jobs acknowledged, the scheduler
   SIGKILLed, its WAL cut to its header: the restart refused naming them, then resumed with
   --accept-journal-loss logging each by id), then the tests of each fault fixed in that round:
   gauges at 0, cut WALs, journal records no scheduler writes, a full disk at open, hostile
   agents, partitions and sweep SPECs beyond any cluster, an unwritable --out, ListJobs and
   token-file faults, a lockstep replay's divergence, reason counters at 0, a test timing out
   with its scheduler running, scaled deadlines (``--only-scheduler-2``: this part alone).

Prints one Markdown table (the one in docs/reliability.md) and exits 1 if any drill lost
acknowledged work, left a traceback, hung or failed.

    .venv/bin/python bench/drill_faults.py                # everything (about 3-5 minutes)
    .venv/bin/python bench/drill_faults.py --stalls 5 --jobs 600
    .venv/bin/python bench/drill_faults.py --gateway-only
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysim._protos.v1 import scheduler_pb2 as spb  # noqa: E402
from analysim.clusters import parse_cluster, split_nodes  # noqa: E402
from scheduler_svc.launcher import LocalRun  # noqa: E402
from tests.polling import wait_until  # noqa: E402
from tests.test_live_helpers import wait_port_free  # noqa: E402

# Each fault test, with the fault it injects (numbered as docs/reliability.md numbers them).
FAULT_TESTS = [  # (fault, how many injected, the test)
    ("1 agent stalled past its deadline (lockstep)", "1", "tests/test_live_faults.py::test_lockstep_agent_stalled_past_its_deadline_comes_back"),
    ("2 poison query-log rows (7 kinds)", "7", "tests/test_monitor_quarantine.py::test_poison_rows_are_quarantined_and_the_monitor_goes_on"),
    ("2 monitor unable to read the log", "1", "tests/test_monitor_quarantine.py::test_a_monitor_that_cannot_read_the_log_is_not_up_nor_ready"),
    ("3 disk full under the journal", "1", "tests/test_live_disk_full.py"),
    ("4 damaged journals (cut, flipped, WAL, empty)", "4", "tests/test_live_journal_damage.py"),
    ("5 large broken model row (20 requests)", "1", "tests/test_gateway_faults.py::test_a_large_broken_model_row_is_parsed_once_until_it_changes"),
    ("6 store missing its ledger", "1", "tests/test_gateway_faults.py::test_a_store_missing_its_ledger_is_refused_not_recreated"),
    ("7 monitor child SIGKILLed", "1", "tests/test_monitor_quarantine.py::test_a_killed_monitor_child_is_restarted"),
    ("8 flood of agent reports (one 3 MB message)", "125,000", "tests/test_live_log_flood.py"),
    ("9 malformed protobuf, hostile ids (scheduler)", "14", "tests/test_contract_faults.py::test_scheduler_contract_under_hostile_input"),
    ("9 malformed protobuf (gateway)", "2", "tests/test_contract_faults.py::test_gateway_answers_malformed_bytes_with_invalid_argument"),
    ("9 tokens rotated, SIGHUP", "2", "tests/test_contract_faults.py::test_tokens_rotated_under_a_running_scheduler_take_effect_at_once"),
    ("10 uploads announcing 1 MB, sending 1 byte", "50", "tests/test_gateway_faults.py::test_slow_uploads_are_cut_off_and_capped"),
    ("10 per-step latencies bounded (200,000 steps)", "-", "tests/test_latency_quantiles.py"),
]


# The second round's gateway faults, each with its test.
GATEWAY_FAULT_TESTS = [  # (fault, how many injected, the test)
    ("G1 store damaged under its meta (ledger+meta, version row, v3, users, a column, bad version)", "6 x 2 backends",
     "tests/test_gateway_faults.py::test_a_damaged_store_is_refused_at_open_whatever_meta_says"),
    ("G2 model rows out of range (negative price, decimals, top_k)", "3 x 2 backends",
     "tests/test_gateway_faults.py::test_a_model_row_out_of_range_is_refused_for_that_model_and_not_charged"),
    ("G2 model row with a text created column", "1",
     "tests/test_gateway_faults.py::test_a_created_column_stored_as_text_takes_down_that_model_alone"),
    ("G3 poison in every query-log column, before start and while running", "12",
     "tests/test_monitor_quarantine.py::test_poison_in_any_column_is_quarantined_at_start_and_while_running"),
    ("G4 disk full under the gateway's store (WAL checkpoints)", "1", "tests/test_gateway_disk_full.py"),
    ("G4 monitor child frozen (SIGSTOP)", "1",
     "tests/test_monitor_quarantine.py::test_a_frozen_monitor_child_holds_no_admin_route_and_stalls_no_answer"),
    ("G5 1,100 idle connections, 1,024 descriptors", "1,100",
     "tests/test_gateway_faults.py::test_idle_connections_do_not_exhaust_descriptors_and_requests_are_served"),
    ("G5 bodies not in their Content-Encoding (gzip, deflate)", "2",
     "tests/test_gateway_faults.py::test_a_body_not_in_its_content_encoding_is_400_without_a_traceback"),
    ("G5 admin body trickling through the monitor forward", "1",
     "tests/test_monitor_quarantine.py::test_a_forwarded_admin_request_gets_the_body_timeout"),
    ("G5 names with a newline (users, groups)", "6",
     "tests/test_monitor_service.py::test_user_and_group_names_with_a_newline_are_refused"),
    ("G5 a flood of log lines (suppressed, counted)", "40",
     "tests/test_gateway_faults.py::test_the_gateway_exports_the_log_lines_its_rate_limit_left_out"),
    ("G6 a test timing out with a gateway and its monitor running", "1",
     "tests/test_suite_hygiene.py::test_a_test_that_times_out_leaves_no_gateway_nor_monitor_behind"),
    ("G6 the suite's image pruning beside a dangling image it did not make (podman)", "2",
     "tests/test_deploy_containers.py::test_pruning_removes_the_suites_dangling_images_and_no_other"),
    ("G7 idempotent replay of a damaged logged answer (cut blobs, label past the classes or negative, NaN "
     "confidence, negative charge)", "7 x 2 backends",
     "tests/test_gateway_idempotency.py::test_a_damaged_logged_answer_is_refused_cleanly_and_not_charged"),
    ("G7 nothing refused yet: every rejection code and cap kind at 0", "31",
     "tests/test_gateway_faults.py::test_every_rejection_reason_is_exported_at_zero_from_the_start"),
]


# The scheduler's faults of the second round, each with its test: numbered on from 11.
SCHEDULER_FAULT_TESTS_2 = [  # (fault, how many injected, the test)
    ("11 nothing pending: every labelled gauge at 0 (partition, VCs)", "2", "tests/test_live_kueue.py::test_every_labelled_gauge_has_each_series_at_zero_when_nothing_happens"),
    ("12 journal WAL cut mid-frame, to its header, emptied, deleted", "4", "tests/test_live_journal_damage.py::test_a_cut_wal_is_refused_naming_the_acknowledged_jobs_it_loses"),
    ("12 journal records no scheduler writes (dropped/re-shaped table, deleted rows, NaN/inf clock, bad status, unknown spec key)", "8", "tests/test_live_journal_damage.py::test_records_no_scheduler_writes_are_refused"),
    ("12 journal table dropped, loss accepted", "1", "tests/test_live_journal_damage.py::test_a_dropped_table_accepted_logs_every_lost_job"),
    ("12 journal WAL that is a directory", "1", "tests/test_live_journal_damage.py::test_a_wal_that_is_a_directory_is_one_line"),
    ("12 journal file removed, its acknowledgement record kept", "1",
     "tests/test_live_journal_damage.py::test_a_journal_removed_without_its_record_is_refused"),
    ("12 intact journal on a full disk; --out on a full disk", "2", "tests/test_live_disk_full.py::test_a_full_disk_at_start_is_reported_as_a_full_disk"),
    ("13 hostile agent: lookahead 0/-1/-inf/NaN, end before launch / +1e12", "6", "tests/test_live_agent_checks.py"),
    ("14 partitions beyond any cluster or reader (1e400, 1e999999, !foo, 20,000-deep, 100,000 ClusterQueues, ...)", "8", "tests/test_live_kueue.py::test_a_partition_beyond_any_cluster_or_reader_is_refused_at_start"),
    ("14 sweep SPECs the run refuses (11 kinds: 1e20 jobs, a million cells, ...), run and --dry-run", "22", "tests/test_sweep.py::test_bad_spec_is_one_line_before_any_cell_runs"),
    ("15 --out unwritable at start, or lost before the end", "4", "tests/test_live_out.py"),
    ("16 ListJobs bad status enum, 10 MB vc", "2", "tests/test_contract_faults.py::test_scheduler_contract_under_hostile_input"),
    ("16 token file not UTF-8 under a running scheduler", "1", "tests/test_contract_faults.py::test_a_token_file_that_is_not_utf8_keeps_the_previous_tokens"),
    ("16 token files rewritten while held open", "1", "tests/test_contract_faults.py::test_token_files_are_replaced_by_rename"),
    ("16 lockstep agent stalled past its deadline: the replay says it diverged from offline", "1",
     "tests/test_live_faults.py::test_lockstep_agent_stalled_past_its_deadline_comes_back"),
    ("17 reason-labelled counters: every reason the code counts is exported at 0 (scheduler, gateway)", "4 lists",
     "tests/test_metric_reasons.py"),
    ("17 a test timing out with a scheduler it started (LocalRun) and never stopped", "1",
     "tests/test_suite_hygiene.py::test_a_test_that_times_out_leaves_no_scheduler_behind"),
    ("17 deadlines stretched by the machine's measured slowdown", "-",
     "tests/test_suite_hygiene.py::test_slowdown_is_measured_and_bounded"),
]


def tracebacks(run: LocalRun) -> int:
    return sum(p.log.read_text(errors="replace").count("Traceback") for p in [*run.agents.values(), run.scheduler])


def stall_drill(tmp: Path, jobs: int, stalls: int) -> dict:
    cluster, nodes = "16x8", 16
    journal = tmp / "journal.db"
    args = ["--jobs", str(jobs), "--seed", "11", "--heartbeat-deadline", "1.5", "--journal", str(journal),
            "--cluster", cluster, "--log-level", "WARNING", "--no-offline-check"]
    run = LocalRun(tmp / "procs")
    start = time.monotonic()
    try:
        run.provision([n.name for n in parse_cluster(cluster).nodes], 2)
        run.start_scheduler(args)
        run.start_agents(cluster, nodes, 2)
        first, count = split_nodes(nodes, 2)[1]
        with run.client() as client:
            client.wait_ready()
            stalled = run.agents[1]
            for i in range(stalls):
                wait_until(lambda i=i: client.cluster_state().jobs_completed >= (i + 1) * jobs // (stalls + 2), 120,
                           "progress")  # fmt: skip
                client.pause()
                stalled.popen.send_signal(signal.SIGSTOP)
                try:
                    client.resume()
                    wait_until(lambda: client.cluster_state().nodes_down == count, 60, "the stalled agent's nodes down")
                finally:
                    stalled.popen.send_signal(signal.SIGCONT)
                wait_until(lambda: client.cluster_state().nodes_down == 0, 60, "its nodes back")
            summary = client.wait_done(300)
            same_agent = stalled.alive() and run.agents[1] is stalled
            acked = [client.submit(num_gpus=2, duration_s=600.0, job_id=f"drill-{i}").job_id for i in range(20)]
            port = run.scheduler.info["grpc"]
            run.kill(run.scheduler, signal.SIGKILL)
            with closing(sqlite3.connect(journal)) as db:
                journalled = {r[0] for r in db.execute("SELECT job_id FROM jobs")}
            wait_port_free(port)
            run.start_scheduler([*args, "--port", str(port)])
            wait_until(lambda: client.cluster_state().clock.started, 120, "the agents back with the new scheduler")
            done = spb.JOB_STATUS_COMPLETED
            wait_until(lambda: all(client.get_job(j).status == done for j in acked), 300, "the client jobs completed")
            kept = len(acked)
            after = client.summary()[1]
        unaccounted = summary["jobs_total"] - summary["jobs_completed"] - summary["jobs_failed"] - summary["jobs_cancelled"]
        return {"drill": f"stall: SIGSTOP/SIGCONT an agent past its deadline x{stalls} (lockstep, {jobs} jobs), "
                         "then SIGKILL the scheduler after 20 client jobs",
                "faults": stalls + 1, "work": summary["jobs_total"] + len(acked),
                "lost": unaccounted + (len(acked) - len(set(acked) & journalled)) + (len(acked) - kept),
                "tracebacks": tracebacks(run), "ok": same_agent and unaccounted == 0 and kept == len(acked)
                and after["jobs_total"] == summary["jobs_total"] + len(acked),
                "seconds": time.monotonic() - start,
                "note": f"agent sessions lost {summary['live']['agents_lost']}, same agent process: {same_agent}; "
                        f"{after['jobs_completed']}/{after['jobs_total']} completed after the restart"}
    finally:
        run.stop()


def fault_tests(tmp: Path, tests: list[tuple[str, str, str]] = FAULT_TESTS, part: str = "") -> list[dict]:
    report = tmp / f"junit{part}.xml"
    ids = [t for _, _, t in tests]
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *ids],
                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)  # fmt: skip
    cases = []
    for tc in ET.parse(report).getroot().iter("testcase"):
        path = tc.get("classname", "").replace(".", "/") + ".py"
        bad = any(c.tag in ("failure", "error") for c in tc)
        skipped = any(c.tag == "skipped" for c in tc)
        text = "".join(c.text or "" for c in tc)
        cases.append({"path": path, "name": tc.get("name", ""), "ok": not bad, "skipped": skipped,
                      "seconds": float(tc.get("time", 0)), "tracebacks": 0 if not bad else text.count("Traceback")})
    out = []
    for label, faults, test in tests:
        path, _, name = test.partition("::")
        # (a parametrised test's cases are named NAME[PARAMS])
        mine = [c for c in cases if c["path"] == path and (not name or c["name"].split("[")[0] == name)]
        out.append({"drill": label, "faults": faults, "work": "-", "lost": 0 if mine and all(c["ok"] for c in mine) else "?",
                    "tracebacks": sum(c["tracebacks"] for c in mine), "ok": bool(mine) and all(c["ok"] for c in mine),
                    "seconds": sum(c["seconds"] for c in mine),
                    "note": f"`{test}` ({len(mine)} test{'s' * (len(mine) > 1)})"
                            + (" (skipped)" if any(c["skipped"] for c in mine) else "")})
    return out


def journal_loss_drill(tmp: Path, clients: int = 10) -> dict:
    """Acknowledged client jobs, the scheduler SIGKILLed, its WAL cut to its header: the restart
    is refused in one line naming them; with --accept-journal-loss it resumes and logs every
    lost one by id. Lost: acknowledged jobs neither in the journal nor named."""
    cluster = "8x8"
    journal = tmp / "journal-loss" / "journal.db"
    journal.parent.mkdir()
    args = ["--jobs", "100", "--seed", "6", "--journal", str(journal), "--cluster", cluster, "--log-level", "WARNING",
            "--no-offline-check"]
    run = LocalRun(tmp / "journal-loss" / "procs")
    start = time.monotonic()
    try:
        run.provision([n.name for n in parse_cluster(cluster).nodes], 1)
        run.start_scheduler(args)
        run.start_agents(cluster, 8, 1)
        with run.client() as client:
            client.wait_ready()
            acked = [client.submit(num_gpus=1, duration_s=30.0).job_id for _ in range(clients)]
            client.wait_done(120)
        run.kill(run.scheduler, signal.SIGKILL)
        found = tracebacks(run)
    finally:
        run.stop()
    with open(f"{journal}-wal", "r+b") as f:
        f.truncate(32)  # the WAL's header only: every frame gone
    refused = subprocess.run([sys.executable, "-m", "scheduler_svc", "serve", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    one_line = refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    again = LocalRun(tmp / "journal-loss" / "accepted")
    named: set[str] = set()
    try:
        again.start_scheduler([*args, "--accept-journal-loss"])
        line = next((x for x in again.scheduler.log.read_text().splitlines() if "acknowledged client job(s): " in x), "")
        named = set(line.split("acknowledged client job(s): ", 1)[-1].split(", ")) if line else set()
        found += refused.stderr.count("Traceback") + again.scheduler.log.read_text().count("Traceback")
    finally:
        again.stop()
    with closing(sqlite3.connect(journal)) as db:
        kept = {r[0] for r in db.execute("SELECT job_id FROM jobs WHERE source = 'client'")}
    lost = len(set(acked) - kept - named)
    return {"drill": f"journal: {clients} client jobs acknowledged, SIGKILL, WAL cut to its header, restart, "
                     "restart accepting the loss",
            "faults": 1, "work": clients, "lost": lost, "tracebacks": found,
            "ok": one_line and f"{clients} acknowledged client job(s)" in refused.stderr and lost == 0
            and named == set(acked) - kept,
            "seconds": time.monotonic() - start,
            "note": f"refused: exit {refused.returncode}, one line: {one_line}; accepted: {len(named)} lost job(s) "
                    f"named in the log, {len(kept)} kept"}


def scheduler_faults_2(tmp: Path) -> list[dict]:
    """The second round of the scheduler's faults: the journal drill, then each fault's test."""
    return [journal_loss_drill(tmp), *fault_tests(tmp, SCHEDULER_FAULT_TESTS_2, "-scheduler-2")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--stalls", type=int, default=3)
    ap.add_argument("--skip-tests", action="store_true", help="the stall drill only")
    ap.add_argument("--gateway-only", action="store_true", help="the second round's gateway fault tests only")
    ap.add_argument("--only-scheduler-2", action="store_true",
                    help="only the scheduler's second round (the journal drill and its fault tests)")
    a = ap.parse_args()
    only = a.gateway_only or a.only_scheduler_2
    with tempfile.TemporaryDirectory(prefix="analysim-drill-") as d:
        rows = [] if only else [stall_drill(Path(d), a.jobs, a.stalls)]
        if not a.skip_tests and not only:
            rows += fault_tests(Path(d))
        if not a.skip_tests and not a.only_scheduler_2:
            rows += fault_tests(Path(d), GATEWAY_FAULT_TESTS, "-gateway")
        if not a.skip_tests and not a.gateway_only:
            rows += scheduler_faults_2(Path(d))
    print("| drill | faults injected | acknowledged work | lost | tracebacks | result | wall s | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['drill']} | {r['faults']} | {r['work']} | {r['lost']} | {r['tracebacks']} | "
              f"{'pass' if r['ok'] else 'FAIL'} | {r['seconds']:.1f} | {r['note']} |")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
