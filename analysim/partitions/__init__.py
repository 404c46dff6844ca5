"""Readers of a cluster's logical partition (``--partition FILE``) into the core's model
(analysim.core.partition): Kueue's objects today (analysim.partitions.kueue). Also what every
reader shares: the labels the cluster's nodes carry, which flavors' node selectors match, and
putting a trace's jobs onto the partition's queues."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from analysim.core.cluster import ClusterSpec, NodeSpec
from analysim.core.job import JobSpec
from analysim.core.partition import Partition, QuotaTree, requests_of
from analysim.errors import UserError

# Labels every node of a cluster spec carries (Kubernetes' well-known hostname label, NVIDIA GPU
# feature discovery's product and count, and ours for what Kubernetes has no name for).
HOSTNAME = "kubernetes.io/hostname"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_MODEL = "analysim.io/gpu-model"
RACK = "analysim.io/rack"


def node_labels(node: NodeSpec) -> dict[str, str]:
    """The labels a ResourceFlavor's ``nodeLabels`` are matched against."""
    return {HOSTNAME: node.name, GPU_PRODUCT: node.gpu_model, GPU_MODEL: node.gpu_model,
            GPU_COUNT: str(node.gpus), RACK: node.rack}


def load_partition(path: str, cluster: ClusterSpec, settings: Sequence[str] = ()) -> tuple[Partition, list[str]]:
    """A partition file read against ``cluster``, with ``settings`` (``--partition-set``
    PATH=VALUE, analysim.partitions.edits) applied: the partition and the warnings (fields
    accepted but not modelled), once each."""
    from analysim.partitions.edits import apply_settings
    from analysim.partitions.kueue import read_kueue

    partition, warnings = read_kueue(path, cluster)
    return (apply_settings(partition, settings) if settings else partition), warnings


def without_vcs(cluster: ClusterSpec) -> ClusterSpec:
    """The cluster whose logical partition a partition file replaces: its VCs (quotas, dedicated
    nodes) are not read."""
    return dataclasses.replace(cluster, vcs=())


def assign_queues(jobs: Sequence[JobSpec], partition: Partition,
                  vc_map: dict[str, str] | None = None, default_queue: str | None = None) -> tuple[list[JobSpec], Counter]:
    """The jobs that can be admitted ever, each with its VC the name of its LocalQueue (the
    trace VC's own name, or what ``vc_map`` maps it to, or ``default_queue``; a VC
    ``namespace/name`` is the LocalQueue ``name`` when no other namespace has one of that name);
    the others counted
    by reason: ``no_local_queue`` (no LocalQueue for its VC), ``resource_not_covered`` (it asks for a
    resource its ClusterQueue has no quota of, or none of its flavors' nodes), ``larger_than_queue_quota``
    (more than its ClusterQueue could ever be admitted, borrowing all it may)."""
    queues = dict(partition.queue_of)
    if default_queue is not None and default_queue not in queues:
        raise UserError(f"--default-vc: the partition has no LocalQueue {default_queue!r}; "
                        f"it has {', '.join(sorted(queues))}")
    tree = QuotaTree(partition)
    most: dict[tuple[str, tuple[str, ...]], bool] = {}
    kept: list[JobSpec] = []
    reasons: Counter = Counter()
    for j in jobs:
        lq = (vc_map or {}).get(j.vc, j.vc)
        if lq not in queues and "/" in lq:
            # A Kueue Workload's queue is namespace/LocalQueue; the partition names a LocalQueue
            # by its name alone where that name is in one namespace (kueue.local_queue_names).
            lq = lq.partition("/")[2]
        if lq not in queues:
            if default_queue is None:
                reasons["no_local_queue"] += 1
                continue
            lq = default_queue
        if lq != j.vc:
            j = dataclasses.replace(j, vc=lq)
        verdict = _ever_admitted(tree, partition, queues[lq], j, most)
        if verdict:
            reasons[verdict] += 1
            continue
        kept.append(j)
    return kept, reasons


def _ever_admitted(tree: QuotaTree, partition: Partition, queue: str, job: JobSpec, seen: dict) -> str:
    """'' when some flavor assignment could admit the job on an idle cluster, else the reason."""
    requests = requests_of(job)
    key = (queue, tuple(sorted(requests.items())))
    if key in seen:
        return seen[key]
    q = tree.index[queue]
    node = partition.nodes[q]
    covered = {r for g in node.groups for r in g.resources}
    verdict = ""
    if any(r not in covered for r in requests):
        verdict = "resource_not_covered"
    for group in node.groups:
        wanted = [(r, v) for r, v in requests.items() if r in group.resources]
        if verdict or not wanted:
            continue
        with_quota = [f for f in group.flavors if all((f, r) in tree.quota[q] for r, _ in wanted)]
        if not with_quota:
            verdict = "resource_not_covered"
        elif not any(all(tree.potential(q, (f, r)) >= v for r, v in wanted) for f in with_quota):
            verdict = "larger_than_queue_quota"
    seen[key] = verdict
    return verdict
