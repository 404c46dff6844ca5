"""Whether a job could ever run on a cluster: the checks every submitted job goes through."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np

from analysim.core import placement
from analysim.core.cluster import ClusterSpec, ClusterState
from analysim.core.job import MAX_TIME_S, JobSpec
from analysim.core.records import InfeasibleJob

if TYPE_CHECKING:
    from analysim.core.framework import Handle


_FITS: Final = 1  # a shape fits the empty cluster
_NO_NODE: Final = -1  # no node is open to a shape (its GPU models, its dedicated VC's nodes)


class Feasibility:
    """Invariant: ``_fits_empty[shape]`` is _FITS when a job of that shape fits the empty cluster
    with the nodes up now, _NO_NODE when no node is open to it, else 0 (forget() on every node
    event); traces repeat a few shapes."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec  # the cluster the checks are against
        self._vc_names = frozenset(v.name for v in spec.vcs)  # the VCs the cluster names
        self._fits_empty: dict[tuple, int] = {}  # shape -> _FITS, _NO_NODE or 0 (see above)
        self._empty_state: ClusterState | None = None  # every node free (made when first needed)

    def forget(self) -> None:
        """A node went down or up."""
        self._fits_empty.clear()

    def check(self, h: Handle, spec: JobSpec) -> None:
        """Raise InfeasibleJob if no empty cluster could ever run the job."""
        if spec.duration_s is not None and not 0 <= spec.duration_s <= MAX_TIME_S:  # (NaN fails too)
            raise InfeasibleJob(f"job {spec.job_id!r}: duration must be a number from 0 to {MAX_TIME_S:g} s",
                                "bad_duration")
        if not 0 <= spec.submit_s <= MAX_TIME_S:
            raise InfeasibleJob(f"job {spec.job_id!r}: submit time must be from 0 to {MAX_TIME_S:g} s", "bad_submit")
        if h.spec.vcs and spec.vc not in self._vc_names:
            # The one rule, offline and live: a cluster that names its VCs runs only their jobs
            # (map a trace's VCs onto them first: analysim.vcmap).
            raise InfeasibleJob(f"job {spec.job_id!r}: unknown virtual cluster {spec.vc!r}", "unknown_vc")
        quota = h.quota_of(spec.vc)
        if not h.spec.allow_borrowing and quota is not None and spec.gpu_demand > quota + 1e-9:
            raise InfeasibleJob(f"job {spec.job_id!r}: asks for {spec.gpu_demand:g} GPUs, more than VC {spec.vc!r}'s "
                                f"quota of {quota:g}, and borrowing is off", "larger_than_vc_quota")
        # (The shape names what the nodes open to the job depend on: its GPU models and dedicated VC.)
        shape = (spec.num_gpus, spec.gpu_milli, spec.cpu_milli, spec.memory_mib, spec.gpu_models,
                 spec.vc if spec.vc in h.dedicated else None)  # fmt: skip
        fits = self._fits_empty.get(shape)
        if fits is None:
            static = h.static_mask(spec)
            if not static.any():
                fits = self._fits_empty[shape] = _NO_NODE
            else:
                if self._empty_state is None:
                    self._empty_state = ClusterState(self.spec)
                fits = self._fits_empty[shape] = _FITS if placement.can_place(h, spec, static, self._empty_state) else 0
        if fits == _NO_NODE:
            models = "|".join(spec.gpu_models) or "any"
            raise InfeasibleJob(f"job {spec.job_id!r}: no node of GPU model {models} is open to VC {spec.vc!r}",
                                "no_matching_node")
        if not fits:
            raise InfeasibleJob(
                f"job {spec.job_id!r}: asks for {spec.num_gpus} GPU(s) x {spec.gpu_milli}/1000, "
                f"{spec.cpu_milli} CPU milli, {spec.memory_mib} MiB, more than the cluster can ever hold",
                "larger_than_cluster")

    def fits_when_all_up(self, h: Handle, spec: JobSpec) -> bool:
        """Whether the job would fit the empty cluster with every node up."""
        if h.state.up.all():
            return False
        if self._empty_state is None:
            self._empty_state = ClusterState(self.spec)
        st = h.state
        mask = np.array([o == (spec.vc if spec.vc in h.dedicated else None) for o in st.owner_vc], dtype=bool)
        if spec.gpu_models:
            mask &= np.isin(st.model_id, [i for i, m in enumerate(st.model_names) if m in spec.gpu_models])
        return bool(mask.any()) and placement.can_place(h, spec, mask, self._empty_state)
