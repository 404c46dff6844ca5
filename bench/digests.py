"""sha256 of jobs.csv (inflate.csv under --mode inflate) for a fixed set of runs: record before a speed change, compare after.

Not a golden test (tests hold those); a working tool for speed work, whose every change must
leave schedules byte-identical.

    python bench/digests.py > /tmp/before.txt      # before the change
    python bench/digests.py | diff /tmp/before.txt -  # after: no output means identical
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces"

EMBEDDED = [
    ["--policy", "fifo"],
    ["--policy", "fifo", "--backfill"],
    ["--policy", "sjf"],
    ["--policy", "srtf"],
    ["--policy", "tiresias"],
    ["--policy", "qssf"],
    ["--policy", "fair"],
    ["--policy", "srtf", "--preemption", "--migration"],
    ["--policy", "tiresias", "--preemption", "--migration"],
    ["--policy", "fifo", "--migration"],
]
PHILLY = [
    ["--policy", "fifo"],
    ["--policy", "srtf", "--preemption"],
    ["--policy", "tiresias", "--preemption", "--migration"],
]


def runs() -> list[list[str]]:
    out = [list(a) for a in EMBEDDED]
    if (SHARED / "philly.csv").exists():
        out += [["--trace", str(SHARED / "philly.csv"), "--cluster", "philly", "--limit", "3000", *a] for a in PHILLY]
    sample = SHARED / "philly_sample20k_1000pm.csv"
    if sample.exists():
        out.append(["--trace", str(sample), "--cluster", "1x6500", "--policy", "sjf", "--limit", "5000"])
    pods, nodes = SHARED / "openb_pod_list_default.csv", SHARED / "openb_node_list_gpu_node.csv"
    if pods.exists() and nodes.exists():
        out += [["--trace", str(pods), "--cluster", str(nodes), "--placement", "fgd", "--mode", m]
                for m in ("replay", "inflate")]
    return out


def main() -> int:
    exe = Path(sys.executable).parent / "analysim"
    for args in runs():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([str(exe), "simulate", *args, "--no-plots", "--out", tmp], check=True,
                           stdout=subprocess.DEVNULL)
            out = Path(tmp) / "jobs.csv"
            if not out.exists():
                out = Path(tmp) / "inflate.csv"  # --mode inflate's schedule
            digest = hashlib.sha256(out.read_bytes()).hexdigest()
        label = " ".join(a.replace(str(SHARED) + "/", "") for a in args)
        print(f"{digest}  {label}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
