"""Evictions on a run, from its decision log: how many instants evicted jobs, and how many victims
each (BENCHMARKS-HISTORY.md, "Preemption victims").

    .venv/bin/python bench/preemption_events.py --policy tiresias --limit 20000
"""

from __future__ import annotations

import argparse
from collections import Counter
from itertools import groupby

from analysim.clusters import parse_cluster
from analysim.simulation import RunOptions, run
from analysim.traces import load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="../shared/traces/philly.csv")
    ap.add_argument("--cluster", default="philly")
    ap.add_argument("--policy", default="srtf")
    ap.add_argument("--limit", type=int, default=20000)
    args = ap.parse_args()
    result = run(load_trace(args.trace).jobs, parse_cluster(args.cluster),
                 RunOptions(policy=args.policy, preemption=True, migration=True, limit=args.limit))
    evictions = [d for d in result.decisions if d.kind == "preempt"]
    per_instant = Counter(len(list(group)) for _, group in groupby(evictions, key=lambda d: d.time))
    instants = sum(per_instant.values())
    print(f"{args.policy}: {len(evictions)} victims at {instants} instants, "
          f"{len(evictions) / max(instants, 1):.2f} per instant; victims per instant -> instants: "
          f"{dict(sorted(per_instant.items()))}")


if __name__ == "__main__":
    main()
