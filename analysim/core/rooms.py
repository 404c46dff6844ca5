"""The free GPUs of each dedicated VC's nodes, kept while the running jobs and the nodes stay the
same: a pass that only launches leaves out the widths no such VC's nodes can take."""

from __future__ import annotations

from dataclasses import dataclass

from analysim.core.cluster import ClusterState


@dataclass(slots=True)
class Room:
    """The whole GPUs free on one dedicated VC's nodes that are up, as found at ``version``."""

    version: tuple[int, int]  # (World.running, World.nodes) when found
    most: int  # the most whole GPUs free on one of its nodes
    total: int  # the whole GPUs free on its nodes
    smallest: int  # the GPUs of its smallest node

    def cannot_fit(self, w: int) -> bool:
        """Whether no job of ``w`` whole GPUs can fit on these nodes as they stand (one that fits
        on any node of them, or one wider than all)."""
        return self.most < w <= self.smallest or self.total < w


class DedicatedRooms:
    """Room per dedicated VC, kept while the running jobs and the nodes stay the same. Without it,
    on a cluster of dedicated VCs, one VC's idle nodes keep every width of every other VC in the
    pass, whose jobs are then passed over one by one."""

    def __init__(self, state: ClusterState, dedicated: set[str]) -> None:
        self.state = state  # the cluster's nodes and free GPUs (read only)
        self.nodes: dict[str, list[int]] = {  # dedicated VC -> its nodes
            vc: [i for i, owner in enumerate(state.owner_vc) if owner == vc] for vc in dedicated}
        self.smallest: dict[str, int] = {  # dedicated VC -> the GPUs of its smallest node
            vc: min((int(state.gpus[n]) for n in nodes), default=0) for vc, nodes in self.nodes.items()}
        self._rooms: dict[str, Room] = {}  # dedicated VC -> its room as last found

    def room(self, vc: str, version: tuple[int, int]) -> Room:
        got = self._rooms.get(vc)
        if got is None or got.version != version:
            st = self.state
            free = [int(st.full_free[n]) for n in self.nodes[vc] if st.up[n]]
            got = self._rooms[vc] = Room(version, max(free, default=0), sum(free), self.smallest[vc])
        return got
