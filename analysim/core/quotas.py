"""The GPU quota of each VC in the shared pool, looked up a few times per job per pass."""

from __future__ import annotations

from analysim.core.cluster import ClusterSpec


class VcQuotas:
    """Invariant: ``of_vc[vc]`` is None for a VC with dedicated nodes (its nodes are its
    guarantee) and its quota in GPUs otherwise; a VC the cluster does not name gets ``unknown``
    (0 when the cluster names VCs: it is guaranteed nothing; None without VCs: no quotas)."""

    def __init__(self, spec: ClusterSpec, dedicated: set[str]) -> None:
        self.of_vc: dict[str, float | None] = {  # VC -> its quota in GPUs (None: dedicated nodes)
            v.name: None if v.name in dedicated else v.quota_gpus for v in spec.vcs}
        self.unknown: float | None = 0.0 if spec.vcs else None  # the quota of a VC not named

    def quota_of(self, vc: str) -> float | None:
        return self.of_vc.get(vc, self.unknown)
