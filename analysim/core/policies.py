"""Named policies: compositions of plugins, as ``--policy`` and ``--placement`` spell them."""

from __future__ import annotations

from collections.abc import Mapping

from analysim.core.cluster import ClusterSpec
from analysim.core.control_plane import ControlPlane, ControlPlaneConfig
from analysim.core.framework import Policy
from analysim.core.plugins.kueue import KueueAdmission, KueueQueue
from analysim.core.plugins.kueue_preemption import KueuePreemption
from analysim.core.plugins.kueue_share import Shares
from analysim.core.plugins.kueue_state import KueueState
from analysim.core.plugins.migration import DefragMigration
from analysim.core.plugins.preemption import PriorityPreemption, QuotaReclaim
from analysim.core.plugins.queue import QUEUE_SORTS
from analysim.core.plugins.score import SCORE_ALIASES, SCORES

POLICY_ALIASES = {"fifo-backfill": ("fifo", True), "easy": ("fifo", True), "las": ("tiresias", False)}


def policy_names() -> list[str]:
    return sorted(QUEUE_SORTS) + ["fifo-backfill"]


def placement_names() -> list[str]:
    return sorted(SCORES) + ["bestfit"]


def build_policy(queue: str, score: str = "consolidate", *, backfill: bool = False,
                 queue_options: Mapping[str, object] | None = None) -> Policy:
    """E.g. ``build_policy("tiresias", "fgd")``. Unknown names raise ValueError listing the known ones.

    ``queue_options`` are passed to the queue plugin, e.g. ``{"thresholds_gpu_s": (100.0,)}`` for
    Tiresias; an option the queue does not take raises ValueError.

    Preemption and migration are mechanisms switched on in EngineConfig; the policy always carries
    the plugins, so that the same policy can be run with and without them.
    """
    qname, bf = POLICY_ALIASES.get(queue, (queue, False))
    if qname not in QUEUE_SORTS:
        raise ValueError(f"unknown policy {queue!r}; known: {', '.join(policy_names())}")
    sname = SCORE_ALIASES.get(score, score)
    if sname not in SCORES:
        raise ValueError(f"unknown placement {score!r}; known: {', '.join(placement_names())}")
    cls = QUEUE_SORTS[qname]
    options = dict(queue_options or {})
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
        raise ValueError(f"queue {qname!r} takes no option {', '.join(map(repr, unknown))}; "
                         f"it takes: {', '.join(cls.options) or 'none'}")
    try:  # (an option of the wrong type)
        q = cls(**options)
    except TypeError as e:
        raise ValueError(f"queue {qname!r}: {e}") from None
    backfill = backfill or bf
    if backfill and not q.blocking:
        raise ValueError(f"backfill applies to the blocking FIFO queue, not {qname!r}")
    name = qname + ("+backfill" if backfill else "") + f"/{sname}"
    return Policy(
        name=name,
        queue=q,
        score=SCORES[sname](),
        post_filters=[PriorityPreemption(), QuotaReclaim()],
        rebalance=DefragMigration(),
        backfill=backfill,
    )


# The queue names a run under a partition accepts: Kueue orders its own queues.
PARTITION_QUEUES = ("kueue", "fifo")


def partition_policy(cluster: ClusterSpec, score: str = "consolidate",
                     control: ControlPlaneConfig | None = None) -> Policy:
    """The policy of a run on a cluster with a partition (``cluster.partition``): Kueue's queueing and
    quota admission, the given placement, and Kueue's preemption as the one post-filter when some
    ClusterQueue's policies preempt (the engine then preempts: the partition file drives it, not
    EngineConfig.preemption); no migration. ``control``: the control plane that paces it (None:
    none, a pass at every change)."""
    partition = cluster.partition
    if partition is None:
        raise ValueError(f"cluster {cluster.name!r} has no partition")
    sname = SCORE_ALIASES.get(score, score)
    if sname not in SCORES:
        raise ValueError(f"unknown placement {score!r}; known: {', '.join(placement_names())}")
    state = KueueState(partition, [n.name for n in cluster.nodes])
    if partition.fair_sharing is not None:
        state.shares = Shares(state.tree)  # (fair sharing: admission order and preemption by share)
    post_filters: list = [KueuePreemption(state)] if partition.preempts else []
    paced = ControlPlane(control) if control is not None else None
    return Policy(name=f"kueue/{sname}", queue=KueueQueue(state, paced), score=SCORES[sname](),
                  post_filters=post_filters, admission=KueueAdmission(state, paced), control=paced)
