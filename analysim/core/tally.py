"""What the running jobs hold, counted at every launch and stop: the GPUs, CPU and memory taken
from the nodes' free arrays (ClusterState), and the totals the recorder, the quota checks and the
plugins read instead of summing over the running jobs."""

from __future__ import annotations

import numpy as np

from analysim.core import placement
from analysim.core.cluster import ClusterState
from analysim.core.job import GPU_MILLI, JobRun, Placement
from analysim.core.placement import cpu_mem_on


class Tally:
    """Invariants: ``allocated_gpus`` is the sum of the running jobs' GPU demand,
    ``allocated_by_model[m]`` its part on nodes of GPU model m and ``state.vc_used[vc]`` the part
    of ``vc``'s jobs; ``gpus_of_vc[vc][n]`` counts the GPU slots ``vc``'s running jobs hold on node
    n; ``up_gpus`` is the GPUs of the nodes that are up; ``stopped_by_vc[vc]`` only grows."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state  # the nodes' free arrays, which charge and release change
        self.allocated_gpus = 0.0  # sum of running jobs' GPU demand
        self.up_gpus = float(state.gpus.sum())  # GPUs on nodes that are up
        self.allocated_by_model = np.zeros(len(state.model_names))  # GPU demand running per GPU model
        # VC -> GPU slots its running jobs hold per node (full_free's dtype: a cast per addition
        # tripled its cost); quota reclaim's bound reads it (Handle.gpus_of_vc)
        self.gpus_of_vc: dict[str, np.ndarray] = {}
        self.stopped_by_vc: dict[str, float] = {}  # VC -> GPUs of every stop so far (ended, evicted, moved)
        # VCs whose GPUs held changed since the recorder last took them (take_touched): it
        # integrates each VC's usage from one change to the next, not at every tick of the clock
        self.touched: set[str] = set()

    def charge(self, job: JobRun, pl: Placement) -> None:
        """A job starts on ``pl``."""
        spec, st = job.spec, self.state
        held = self.gpus_of_vc.get(spec.vc)
        if held is None:
            held = self.gpus_of_vc[spec.vc] = np.zeros(st.num_nodes, dtype=st.full_free.dtype)
        for n, slots in pl.gpus:
            cpu, mem = cpu_mem_on(spec, slots, len(pl.gpus))
            st.allocate(n, slots, spec.gpu_milli, cpu, mem)
            self.allocated_by_model[st.model_id[n]] += len(slots) * spec.gpu_milli / GPU_MILLI
            held[n] += len(slots)
        st.vc_used[spec.vc] = st.vc_used.get(spec.vc, 0.0) + spec.gpu_demand
        self.allocated_gpus += spec.gpu_demand
        self.touched.add(spec.vc)

    def release(self, job: JobRun, pl: Placement) -> None:
        """A running job on ``pl`` stops (ends, is evicted or moves)."""
        spec, st = job.spec, self.state
        placement.release_on(st, job)
        held = self.gpus_of_vc[spec.vc]
        for n, slots in pl.gpus:
            self.allocated_by_model[st.model_id[n]] -= len(slots) * spec.gpu_milli / GPU_MILLI
            held[n] -= len(slots)
        st.vc_used[spec.vc] -= spec.gpu_demand
        self.stopped_by_vc[spec.vc] = self.stopped_by_vc.get(spec.vc, 0.0) + spec.gpu_demand
        self.allocated_gpus -= spec.gpu_demand
        self.touched.add(spec.vc)

    def take_touched(self) -> list[str]:
        """The VCs whose GPUs held changed since the last call (and none from now on)."""
        touched = sorted(self.touched)  # (sorted: the integrals' sums are made in one order, run after run)
        self.touched.clear()
        return touched
