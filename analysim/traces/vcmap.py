"""Putting a trace's virtual clusters onto a cluster's: when a trace meets a cluster other than its
own, its VC names are not the cluster's, and a cluster that names its VCs refuses jobs of any other
(offline and live alike). Three ways to map them, each only when asked:

- a map file: CSV with header ``trace_vc,cluster_vc``, one row per trace VC;
- ``share``: the trace's VCs, heaviest GPU-time first, each onto the cluster VC whose load relative
  to its guaranteed GPUs (quota, or dedicated nodes' GPUs) would be lowest — a longest-processing-
  time-first balance, deterministic (ties to the VC listed first);
- a default VC for every trace VC the map (or the cluster) does not name.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path

from analysim.core.cluster import ClusterSpec
from analysim.core.job import JobSpec
from analysim.errors import UserError
from analysim.traces.base import CsvInput

BY_SHARE = "share"


def read_vc_map(path: str | Path, cluster: ClusterSpec, targets: Collection[str] | None = None) -> dict[str, str]:
    """Trace VC -> cluster VC from a map file; ``targets``: the names a cluster_vc may be (default
    the cluster's VCs; a partition's LocalQueues under --partition)."""
    known = {v.name for v in cluster.vcs} if targets is None else set(targets)
    mapping: dict[str, str] = {}
    with CsvInput(path, "VC map", ("trace_vc", "cluster_vc"), strict=True) as src:
        i_t, i_c = src.index["trace_vc"], src.index["cluster_vc"]
        for line, row in src.rows():
            trace_vc, cluster_vc = row[i_t], row[i_c]
            if trace_vc in mapping:
                raise src.error(line, "trace_vc", f"{trace_vc!r} is mapped twice")
            if cluster_vc not in known:
                what = f"cluster {cluster.name!r} has no VC" if targets is None else "the partition has no LocalQueue"
                raise src.error(line, "cluster_vc", f"{what} {cluster_vc!r}")
            mapping[trace_vc] = cluster_vc
    return mapping


def map_by_share(jobs: Sequence[JobSpec], cluster: ClusterSpec) -> dict[str, str]:
    """Trace VC -> cluster VC, balancing the trace's GPU-time over the cluster VCs' guaranteed GPUs."""
    weight = {}
    for v in cluster.vcs:
        if v.nodes:
            weight[v.name] = float(sum(n.gpus for n in cluster.nodes if n.name in v.nodes))
        else:
            weight[v.name] = v.quota_gpus if v.quota_gpus else 1.0
    load: dict[str, float] = defaultdict(float)
    for j in jobs:
        load[j.vc] += (j.duration_s or 0.0) * j.gpu_demand
    assigned = dict.fromkeys(weight, 0.0)
    mapping = {}
    for vc in sorted(load, key=lambda v: (-load[v], v)):
        target = min(weight, key=lambda c: (assigned[c] + load[vc]) / weight[c])
        assigned[target] += load[vc]
        mapping[vc] = target
    return mapping


def apply_vc_map(jobs: Sequence[JobSpec], cluster: ClusterSpec, vc_map: str | None,
                 default_vc: str | None) -> tuple[list[JobSpec], int]:
    """The jobs with their VCs mapped, and how many were changed. A VC the map does not name keeps
    its name if the cluster has it, else takes ``default_vc`` if given (else it is refused later,
    and counted, as ``unknown_vc``)."""
    if vc_map is None and default_vc is None:
        return list(jobs), 0
    if not cluster.vcs:
        raise UserError(f"cluster {cluster.name!r} has no virtual clusters to map the trace's VCs onto "
                        "(--vc-map and --default-vc need a cluster that names its VCs)")
    known = {v.name for v in cluster.vcs}
    if default_vc is not None and default_vc not in known:
        raise UserError(f"--default-vc: cluster {cluster.name!r} has no VC {default_vc!r}; "
                        f"it has {', '.join(v.name for v in cluster.vcs)}")
    mapping: dict[str, str] = {}
    if vc_map == BY_SHARE:
        mapping = map_by_share(jobs, cluster)
    elif vc_map is not None:
        mapping = read_vc_map(vc_map, cluster)
    out, changed = [], 0
    for j in jobs:
        vc = mapping.get(j.vc, j.vc if j.vc in known or default_vc is None else default_vc)
        if vc != j.vc:
            j = dataclasses.replace(j, vc=vc)
            changed += 1
        out.append(j)
    return out, changed
