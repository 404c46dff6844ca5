"""The nodes open to a job, as masks, lists and gang sizes, kept until a node goes down or up.

Which nodes a job may use depends on its GPU models and, for a VC with dedicated nodes, its VC,
and on which nodes are up: traces repeat a few such shapes, and every attempt asks.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from analysim.core import placement
from analysim.core.cluster import ClusterState
from analysim.core.job import JobSpec


class NodeViews:
    """Invariant: every answer kept is the one the nodes up now give (forget() on every node event)."""

    def __init__(self, state: ClusterState, dedicated: set[str]) -> None:
        self.state = state  # the engine's nodes (up, GPU models, owners), read when an answer is made
        self.dedicated = dedicated  # the VCs with nodes of their own (their jobs' key names the VC)
        self._masks: dict[tuple, np.ndarray] = {}  # static key -> static_mask
        self._lists: dict[tuple, tuple[list[bool], bool]] = {}  # static key -> (mask as a list, all True)
        self._gang_sizes: dict[tuple, int] = {}  # (GPUs, models, dedicated VC) -> gang_size

    def forget(self) -> None:
        """A node went down or up."""
        self._masks.clear()
        self._lists.clear()
        self._gang_sizes.clear()

    def static_key(self, spec: JobSpec) -> tuple:
        return (spec.gpu_models, spec.vc if spec.vc in self.dedicated else None)

    def static_mask(self, spec: JobSpec) -> np.ndarray:
        key = self.static_key(spec)
        mask = self._masks.get(key)
        if mask is None:
            st = self.state
            mask = st.up.copy()
            if spec.gpu_models:
                allowed = [i for i, m in enumerate(st.model_names) if m in spec.gpu_models]
                mask &= np.isin(st.model_id, allowed)
            owners = np.array([o == key[1] for o in st.owner_vc], dtype=bool)
            mask &= owners
            self._masks[key] = mask
        return mask

    def open_nodes(self, spec: JobSpec) -> tuple[list[bool], bool]:
        """(static_mask as a list, whether it is all True): for loops over running jobs' nodes, where
        a numpy index per node cost more than the rest of the loop."""
        key = self.static_key(spec)
        got = self._lists.get(key)
        if got is None:
            nodes = cast(list[bool], self.static_mask(spec).tolist())
            got = self._lists[key] = (nodes, all(nodes))
        return got

    def gang_size(self, spec: JobSpec) -> int:
        key = (spec.num_gpus, spec.gpu_models, spec.vc if spec.vc in self.dedicated else None)
        k = self._gang_sizes.get(key)
        if k is None:
            k = self._gang_sizes[key] = placement.gang_size(self.state, spec, self.static_mask(spec))
        return k
