"""``analysim load``: the stack's traffic service. Jobs into the scheduler over gRPC at a
rate, and a mix of gateway users — benign, solo attackers, a colluding group — over HTTP,
until --duration passes or SIGTERM (see analysim/traffic.py)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading

from analysim.cli.argtypes import fraction, nonneg_int, positive_seconds, rate, seconds
from analysim.cli.submit import add_credentials, credentials
from analysim.errors import UserError
from analysim.logs import add_logging_arguments, setup_logging

ATTACKS = ("pathfinding", "random")


def attack_list(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    for n in names:
        if n not in ATTACKS:
            raise argparse.ArgumentTypeError(f"unknown attack {n!r} (expected {' or '.join(ATTACKS)})")
    return names


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "load", help="drive a running stack: jobs into the scheduler, benign users and attackers into the gateway",
        description="Jobs arrive at the scheduler (Poisson, --job-rate per wall second); benign users query the "
                    "gateway with rows of --dataset, and attackers run the attack suite (a colluding group splits "
                    "one attack across its accounts, declared as a group). Accounts are created (or given new "
                    "keys) with the admin key from ANALYSIM_ADMIN_KEY or --admin-key-file.",
    )  # fmt: skip
    g = p.add_argument_group("scheduler")
    g.add_argument("--scheduler", metavar="HOST:PORT", help="the scheduler's gRPC address (omit: no jobs)")
    g.add_argument("--job-rate", type=rate, default=0.5, help="jobs per wall second (default 0.5)")
    g.add_argument("--cluster", default="demo", help="the scheduler's cluster, for its VC names (default demo)")
    add_credentials(g)  # a client token: the job injector submits
    w = p.add_argument_group("gateway")
    w.add_argument("--gateway", metavar="URL", help="the gateway, http://HOST:PORT (omit: no queries)")
    w.add_argument("--admin-key-file", help="file holding the admin key (else $ANALYSIM_ADMIN_KEY)")
    w.add_argument("--model", default="wine", help="model id (default wine)")
    w.add_argument("--dataset", default="wine", help="rows the benign users ask about (default wine)")
    w.add_argument("--target", help="the dataset's target column (default as for 'model train')")
    w.add_argument("--benign-users", type=nonneg_int, default=3, help="benign users (default 3)")
    w.add_argument("--attackers", type=attack_list, default=ATTACKS,
                   help="solo attackers, comma-separated: pathfinding, random (default both; '' for none)")
    w.add_argument("--colluders", type=nonneg_int, default=3, help="accounts of the colluding group (default 3; 0: none)")
    w.add_argument("--collude-base", choices=("benign", *ATTACKS), default="pathfinding",
                   help="the attack the group splits (default pathfinding)")
    w.add_argument("--group", default="ring", help="the colluding group's name (default ring)")
    w.add_argument("--quota-rows", type=nonneg_int, help="give every account this row quota (default: unlimited)")
    w.add_argument("--enforce", choices=("none", "degrade", "refuse"), default="none",
                   help="the model's enforcement once a subject's coverage_mass reaches --enforce-threshold (default none)")
    w.add_argument("--enforce-threshold", type=fraction, default=0.9, help="from 0 to 1 (default 0.9)")
    w.add_argument("--query-rate", type=rate, default=2.0, help="requests per second of each benign user (default 2)")
    w.add_argument("--attack-rate", type=rate, default=5.0, help="requests per second of each attacker (default 5)")
    p.add_argument("--duration", type=seconds, default=0.0, metavar="S", help="stop after S wall seconds (0: at SIGTERM)")
    p.add_argument("--ready-timeout", type=positive_seconds, default=120.0, metavar="S",
                   help="wait this long for the scheduler and the gateway to answer (default 120)")
    p.add_argument("--seed", type=int, default=0)
    add_logging_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from analysim.clusters import parse_cluster
    from analysim.traffic import Mix, run_load

    setup_logging("load", args.log_level, args.log_format)
    if not args.scheduler and not args.gateway:
        raise UserError("nothing to load: give --scheduler, --gateway or both")
    vcs = [v.name for v in parse_cluster(args.cluster).vcs] if args.scheduler else []
    token, tls = credentials(args) if args.scheduler else (None, None)
    admin_key, rows = None, None
    mix = Mix(args.benign_users, args.attackers, args.colluders, args.collude_base, args.group, args.quota_rows,
              args.enforce, args.enforce_threshold)
    if args.colluders == 1:
        raise UserError("--colluders: a colluding group needs at least 2 accounts (or 0 for none)")
    if args.gateway:
        from mlaas_monitor.admin_key import load_admin_key
        from mlaas_monitor.datasets import load_dataset

        admin_key = load_admin_key(os.environ, args.admin_key_file)
        ds = load_dataset(args.dataset, args.target) if args.benign_users else None

        def rows(domain):  # noqa: ANN001, ANN202 — an attacks.Domain; encoded rows
            encoded = domain.encode(ds.data)
            if encoded.shape[0] == 0:
                raise UserError(f"--dataset: no row of {args.dataset} fits model {args.model!r}'s schema")
            return encoded

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    counts = run_load(scheduler=args.scheduler, job_rate=args.job_rate, vcs=vcs, token=token, tls=tls, gateway=args.gateway,
                      admin_key=admin_key, model=args.model, rows=rows if args.gateway else None, mix=mix,
                      query_rate=args.query_rate, attack_rate=args.attack_rate, duration_s=args.duration or None,
                      seed=args.seed, stop=stop, ready_deadline_s=args.ready_timeout)  # fmt: skip
    print(json.dumps({"sent": counts.sent, "errors": counts.errors}, sort_keys=True), flush=True)
    return 0
