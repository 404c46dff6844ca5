"""Golden schedules: SHA-256 digests of the per-job output of a few realistic runs, committed in
tests/golden/digests.json, so that any change to decisions at scale is a visible, reviewed diff.

Regenerate (only after a change that is meant to move schedules, and say in the commit message
why the schedule changed):

    .venv/bin/python -m tests.golden_runs          # rewrites tests/golden/digests.json
    .venv/bin/python -m tests.golden_runs NAME...  # only these runs
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from tests.shared import SHARED

DIGESTS = Path(__file__).resolve().parent / "golden" / "digests.json"

PHILLY_LIMIT = 5000
POLICIES = ("fifo", "fifo-backfill", "sjf", "srtf", "tiresias", "qssf", "fair")


def runs() -> dict[str, list[str]]:
    """Run name -> ``analysim simulate`` arguments ({shared} stands for ../shared)."""
    philly = ["--trace", "{shared}/traces/philly.csv", "--cluster", "philly", "--limit", str(PHILLY_LIMIT)]
    out: dict[str, list[str]] = {}
    for policy in POLICIES:
        out[f"philly{PHILLY_LIMIT // 1000}k-{policy}"] = [*philly, "--policy", policy]
        out[f"philly{PHILLY_LIMIT // 1000}k-{policy}-preempt-migrate"] = [*philly, "--policy", policy,
                                                                          "--preemption", "--migration"]
    out["openb-inflate-fgd"] = ["--trace", "{shared}/traces/openb_pod_list_default.csv", "--mode", "inflate",
                                "--placement", "fgd"]
    return out


def needed_files(args: list[str]) -> list[Path]:
    return [Path(a.format(shared=SHARED)) for a in args if "{shared}" in a]


def digest(args: list[str], out: Path) -> str:
    """Run ``analysim simulate`` in this process; the SHA-256 of its per-job CSV."""
    from analysim.cli import build_parser
    from analysim.cli.simulate import simulate

    argv = ["simulate", *(a.format(shared=SHARED) for a in args), "--out", str(out), "--no-plots", "--no-progress"]
    simulate(build_parser().parse_args(argv))
    table = out / ("inflate.csv" if "inflate" in args else "jobs.csv")
    return hashlib.sha256(table.read_bytes()).hexdigest()


def load() -> dict[str, str]:
    return json.loads(DIGESTS.read_text())["jobs_csv_sha256"] if DIGESTS.exists() else {}


def main(names: list[str]) -> int:
    all_runs = runs()
    unknown = [n for n in names if n not in all_runs]
    if unknown:
        print(f"unknown runs: {', '.join(unknown)}; known: {', '.join(all_runs)}", file=sys.stderr)
        return 2
    digests = {k: v for k, v in load().items() if k in all_runs}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or list(all_runs):
            old = digests.get(name)
            digests[name] = digest(all_runs[name], Path(tmp) / name)
            print(f"{name}: {'unchanged' if old == digests[name] else 'CHANGED'}")
    DIGESTS.parent.mkdir(exist_ok=True)
    DIGESTS.write_text(json.dumps({
        "about": "SHA-256 of jobs.csv (inflate.csv) per run of tests/golden_runs.py; regenerate with "
                 "`python -m tests.golden_runs` and say in the commit message why the schedule changed",
        "jobs_csv_sha256": dict(sorted(digests.items())),
    }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
