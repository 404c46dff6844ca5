#!/usr/bin/env python3
"""What a benign population puts in ``auto:pool``, without the gateway: the event sequence
``monitor-eval``'s benign strategy sends (the same seeds, volumes, rows and order) fed
straight into the monitor's core (``ModelMonitor.ingest`` and ``evaluate_due`` per event,
as the service folds them). Per dataset, population size and seed, one line: the pool's
rows, status and warning, the rows that showed the signs (pool.py) and the accounts that
showed them on two and on three or more rows. Minutes for 500 users on Adult; no truth
curves (``monitor-eval`` has them).

    .venv/bin/python bench/benign_pool.py --dataset ../shared/datasets/adult.csv --users 50,500 --seeds 0,1,2,3,4
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mlaas_monitor.monitor.core import ModelMonitor
from mlaas_monitor.monitor.eval_run import EvalOptions, benign_draws, interleaved
from mlaas_monitor.monitor.evaluate import train_target
from mlaas_monitor.monitor.pool import POOL


def population(dataset: str, users: int, seed: int) -> str:
    """One population's line."""
    opts = EvalOptions(dataset=dataset, out=Path("."), benign_users=users, seed=seed, strategies=("benign",))
    target = train_target(opts, lambda _: None)
    rng = np.random.default_rng(seed + 1000)  # monitor-eval's seed for its first strategy
    vols, picks = benign_draws(opts, target.train_X, rng)
    mon = ModelMonitor(target.model)
    sent = np.zeros(users, int)
    for seq, u in enumerate(interleaved(rng, vols).tolist(), 1):
        X = picks[u][sent[u] : sent[u] + 1]
        sent[u] += 1
        name = f"benign-{u + 1:03d}"
        mon.ingest(name, X, target.model.answer(X).labels, seq)
        mon.evaluate_due({name}, {}, float(seq))
    mon.evaluate_due(set(mon.users), {}, 0.0, force=True)
    pool, shown = mon.pools[POOL], mon.ledger.shown
    return (f"{Path(dataset).stem} users {users} seed {seed}: {int(vols.sum())} rows, auto:pool {pool.n_queries} rows, "
            f"best_copy {pool.status['best_copy']:.3f}, {'warned' if pool.warned else 'not warned'}; rows showing the "
            f"signs {sum(shown.values())}, accounts on 2 {sum(1 for n in shown.values() if n == 2)}, on 3 or more "
            f"{sum(1 for n in shown.values() if n >= 3)}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True, help="as for monitor-eval --dataset")
    ap.add_argument("--users", default="50,500", help="comma-separated population sizes (default 50,500)")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default 0-4)")
    args = ap.parse_args()
    for users in (int(x) for x in args.users.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            print(population(args.dataset, users, seed), flush=True)


if __name__ == "__main__":
    main()
