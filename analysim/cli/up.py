"""``analysim up``: the live emulation, all in one — a scheduler process and agent processes on
127.0.0.1 replaying a trace; endpoints and progress on the terminal; the run summary at the end
(and with --out, the same summary.json and jobs.csv as ``analysim simulate``)."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from analysim.cli.common import DEFAULT_CLUSTER
from analysim.clusters import parse_cluster
from analysim.errors import UserError
from analysim.report import summary_table
from analysim.traces.summary import describe_filtered

UP_ONLY = {"agents", "progress_s", "func", "command", "workdir", "keep"}


def register(sub: argparse._SubParsersAction) -> None:
    from scheduler_svc.cli import add_service_arguments

    p = sub.add_parser(
        "up",
        help="live emulation: scheduler service + node agents replaying a trace",
        description="Start the gRPC scheduler service and fake node agents as separate processes on 127.0.0.1, "
                    "replay a trace (default: the embedded synthetic one) in lockstep (--speed max, default) or "
                    "paced (--speed S), print the endpoints, the progress and the run summary, then stop "
                    "everything. See docs/live.md.",
    )
    add_service_arguments(p)
    p.add_argument("--agents", type=int, default=2, help="agent processes sharing the nodes (default 2)")
    p.add_argument("--progress-s", type=float, default=0.5, help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path,
                   help="where the processes' logs, port files, tokens and journal go, kept afterwards "
                        "(default: a temporary folder, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (printed as 'logs') afterwards")
    p.set_defaults(func=main)


def forward_args(args: argparse.Namespace) -> list[str]:
    """The scheduler's own command line, from the options `up` shares with it."""
    from scheduler_svc.cli import add_service_arguments

    ref = argparse.ArgumentParser(add_help=False)
    add_service_arguments(ref)
    out: list[str] = []
    for a in ref._actions:  # noqa: SLF001 — argparse has no public listing
        if not a.option_strings or a.dest in UP_ONLY or a.dest in ("port_file", "exit_when_done"):
            continue
        v = getattr(args, a.dest, a.default)
        if v == a.default or v is None:
            continue
        flag = a.option_strings[-1]
        if isinstance(a, argparse._StoreTrueAction):  # noqa: SLF001
            out.append(flag)
        else:
            if isinstance(v, Path) or a.dest in ("trace", "partition") or (a.dest == "vc_map" and Path(v).is_file()):
                v = str(Path(v).resolve())
            out += [flag, str(v)]
    return out


def cluster_spec(args: argparse.Namespace) -> str:
    """The --cluster to give every process (they run in the repository root: files made absolute)."""
    if args.cluster:
        return str(Path(args.cluster).resolve()) if Path(args.cluster).is_file() else args.cluster
    if args.trace:
        from analysim.traces import detect_format

        fmt = args.format if args.format != "auto" else detect_format(args.trace)
        return DEFAULT_CLUSTER.get(fmt, "philly")
    return DEFAULT_CLUSTER.get("synthetic", "philly")  # as analysim simulate chooses


def main(args: argparse.Namespace) -> int:
    from analysim.tls import TlsFiles

    if args.agents < 1:
        raise UserError("--agents must be at least 1")
    if args.mode != "replay":
        raise UserError("analysim up replays traces in time: --mode inflate is offline only (analysim simulate)")
    spec = args.cluster = cluster_spec(args)
    cluster = parse_cluster(spec)
    if args.trace and not Path(args.trace).exists():
        raise UserError(f"{args.trace}: no such file")
    if args.exit_when_done:
        raise UserError("analysim up always stops once the replay is done; --exit-when-done is an option of "
                        "python -m scheduler_svc serve")
    if args.plots:
        from analysim.report import pyplot

        pyplot()  # matplotlib is there, or a one-line error before anything starts
    for name in ("tls_cert", "tls_key", "tls_ca"):
        if getattr(args, name):
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    # What the agents and this command present and trust: the scheduler's CA, or its own
    # (self-signed) certificate; with --tls-ca (mutual TLS), the same certificate as clients.
    tls = TlsFiles(ca=args.tls_ca or args.tls_cert, cert=args.tls_cert if args.tls_ca else None,
                   key=args.tls_key if args.tls_ca else None)
    # Unreadable files or a certificate that may not do both (serve, and be a client for mutual
    # TLS): one line now, not a scheduler that never answers.
    TlsFiles(args.tls_cert, args.tls_key, args.tls_ca).server_credentials()
    tls.channel_credentials()
    # The children run in the repository root: every path they get is absolute.
    temporary = args.workdir is None
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="analysim-up-"))).resolve()
    try:
        return _run(args, cluster, spec, workdir, tls)
    finally:
        if temporary and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)  # its journal and bearer tokens with it


def _run(args: argparse.Namespace, cluster, spec: str, workdir: Path, tls) -> int:  # noqa: ANN001
    from analysim.portfile import write_port_file
    from scheduler_svc.client import NotServing
    from scheduler_svc.journal import FILE_SUFFIXES
    from scheduler_svc.launcher import LocalRun

    sched_args = forward_args(args)
    if args.journal is None:
        # With the logs, and fresh: resuming is for an explicit --journal.
        for suffix in FILE_SUFFIXES:
            (workdir / f"journal.db{suffix}").unlink(missing_ok=True)
        sched_args += ["--journal", str(workdir / "journal.db")]
    run = LocalRun(workdir, tls=tls)
    run.provision([n.name for n in cluster.nodes], args.agents)
    # SIGTERM (e.g. from `timeout` or a supervisor) stops the children in order, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        info = run.start_scheduler(sched_args)
        print(f"scheduler  grpc {run.target}   metrics http://{info['host']}:{info['metrics']}/metrics")
        run.start_agents(spec, len(cluster.nodes), args.agents)
        for i, p in sorted(run.agents.items()):
            print(f"agent {i:<4} {p.info['host']}:{p.info['metrics']}/metrics   pid {p.pid}")
        kept = "" if args.workdir is not None or args.keep else "   (removed at the end: --keep keeps it)"
        print(f"logs       {workdir}   tokens {run.token_dir}{kept}")
        if args.port_file:
            write_port_file(args.port_file, {**info, "agents": {i: p.info for i, p in run.agents.items()},
                                             "workdir": str(workdir), "tokens": str(run.token_dir)})
        with run.client() as client:
            try:
                client.wait_ready()
            except NotServing as e:
                last = run.scheduler.tail(1) if run.scheduler is not None else ""
                raise UserError(f"{e}; the scheduler's log ({run.scheduler.log}) ends: {last or '(empty)'}") from None
            summary = _follow(client, run, args)
        _report(summary, args)
        return 0
    finally:
        run.stop()


def _follow(client, run, args: argparse.Namespace) -> dict:  # noqa: ANN001
    """Show progress until the replay is done; the summary."""
    tty = sys.stderr.isatty() and not args.no_progress
    last_line = 0.0
    while True:
        if run.scheduler is not None and not run.scheduler.alive():
            raise UserError(f"the scheduler exited (code {run.scheduler.popen.returncode}):\n{run.scheduler.tail()}")
        st = client.cluster_state(queue_limit=1)
        if st.replay_done:
            if tty:
                sys.stderr.write("\r" + " " * 100 + "\r")
            return client.summary()[1]
        ended = st.jobs_completed + st.jobs_failed + st.jobs_cancelled
        line = (f"t={st.clock.time_s / 86400:8.2f} d  jobs {ended}/{st.trace_jobs} done, {st.jobs_running} running, "
                f"{st.jobs_pending} pending  agents {st.agents}  x{st.clock.speed:,.0f}")
        now = time.monotonic()
        if tty:
            sys.stderr.write("\r" + line[:100].ljust(100))
            sys.stderr.flush()
        elif not args.no_progress and now - last_line >= 5.0:
            print(line, file=sys.stderr)
            last_line = now
        time.sleep(args.progress_s)


def _report(summary: dict, args: argparse.Namespace) -> None:
    print(summary_table([(f"{summary['policy']} (live)", summary)]))
    live = summary.get("live", {})
    print(f"mode {live.get('mode')}: {live.get('virtual_s', 0) / 86400:.1f} virtual days in {summary.get('wall_s', 0):.1f} s "
          f"(x{live.get('speedup', 0):,.0f}), {live.get('messages_per_s', 0):,.0f} stream messages/s, decision latency "
          f"p50 {live.get('decision_latency_p50_s', 0) * 1e3:.2f} ms p99 {live.get('decision_latency_p99_s', 0) * 1e3:.2f} ms")
    print(f"accounted for: {summary.get('jobs_completed')} completed, {summary.get('jobs_failed')} failed, "
          f"{summary.get('jobs_cancelled')} cancelled of {summary.get('jobs_total')} jobs")
    fid = summary.get("fidelity")
    if fid:
        print(f"versus the offline run: {fid['identical_jobs']}/{fid['compared_jobs']} jobs with identical start and end; "
              f"|dJCT| mean {fid['mean_abs_delta_jct_s']:.3g} s, max {fid['max_abs_delta_jct_s']:.3g} s "
              f"({fid['divergence_ratio']:.3%} of the mean JCT)")
    if summary.get("jobs_filtered"):
        print(f"filtered out of the trace: {describe_filtered(summary['jobs_filtered'])} (docs/traces.md)")
    if args.out:
        print("wrote " + ", ".join(str(p) for p in sorted(Path(args.out).iterdir()) if p.suffix in (".json", ".csv", ".png")))
    if args.log_level.upper() == "DEBUG":
        print(json.dumps(summary, indent=2))
