"""What the engine's answers are remembered by: the world's versions, and the plugins' memos.

A placement attempt, and every plugin's answer, reads the running jobs and the nodes. ``World``
counts their changes, so that an answer can be kept with the version it was found at and trusted
while the version stands. ``Memos`` are the plugins' scratch space, each living as long as what
its answers read (docs/engine.md lists them); ``NullMemos`` keeps nothing, for the reference engine
the tests compare against (every search starts afresh).
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr


class World:
    """Versions of the allocation. Invariant: ``running`` changes with every launch, stop and node
    event; ``of_vc[vc]`` with every launch and stop of a job of ``vc``; ``nodes`` with every node
    going down or up. (A version only grows, so an equal version means nothing changed.)"""

    def __init__(self) -> None:
        self.running = 0  # launches, stops and node events so far
        self.nodes = 0  # node events so far
        self.of_vc: dict[str, int] = {}  # per VC, launches and stops of its jobs so far
        self.stops = 0  # jobs taken off their GPUs so far (a subset of ``running``'s changes)

    def vc_version(self, vc: str) -> int:
        return self.of_vc.get(vc, 0)

    def job_changed(self, vc: str) -> None:
        """A job of ``vc`` launched or stopped."""
        self.running += 1
        self.of_vc[vc] = self.of_vc.get(vc, 0) + 1

    def nodes_changed(self) -> None:
        self.running += 1
        self.nodes += 1


class _VcEntries:
    """One VC's memo with the versions it was found at (native fields: comparing two ints costs
    less than building and comparing a tuple of boxed ones on each of ~200 k calls)."""

    def __init__(self, version: int, nodes: int) -> None:
        self.version = version  # the VC's running-jobs version the entries were found at
        self.nodes = nodes  # the nodes' version the entries were found at
        self.entries: dict = {}  # the plugins' answers, each keyed with its plugin's name


@mypyc_attr(allow_interpreted_subclasses=True)
class Memos:
    """The plugins' memos. Each plugin keys its entries with its own name.

    - ``pass_memo``: while the pass and the running jobs stay the same (key: pass number, world
      version, time), for what one waiting job's search found out about others (e.g. that none of
      the same shape finds victims).
    - ``vc_memo``: per VC, while that VC's running jobs and the nodes stay the same (other VCs'
      launches and stops do not end it); an entry says itself until when it holds if it reads the
      time.
    - ``lasting``: while the nodes stay the same, for answers that say themselves how long they
      hold (e.g. by how much a VC runs over its quota, which its launches do not shrink).
    """

    def __init__(self) -> None:
        # The pass memo's key, as three fields: comparing them costs a tenth of building and
        # comparing a tuple of boxed values on each of ~390 k calls (callgrind, tiresias + both).
        self._pass_no = -1  # the pass number (-1: no pass yet)
        self._pass_running = -1  # the world's running version (World.running)
        self._pass_now = 0.0  # the time, virtual seconds
        self._pass: dict = {}  # the pass memo's entries, cleared when any of the three fields changes
        self._vc: dict[str, _VcEntries] = {}  # VC -> its vc_memo, replaced when its versions change
        self._lasting: dict = {}  # the lasting memo's entries, cleared when the nodes change

    def pass_memo(self, pass_no: int, running: int, now: float) -> dict:
        if pass_no != self._pass_no or running != self._pass_running or now != self._pass_now:
            self._pass_no, self._pass_running, self._pass_now = pass_no, running, now
            self._pass.clear()
        return self._pass

    def vc_memo(self, vc: str, version: int, nodes: int) -> dict:
        got = self._vc.get(vc)
        if got is None or got.version != version or got.nodes != nodes:
            got = self._vc[vc] = _VcEntries(version, nodes)
        return got.entries

    def lasting(self) -> dict:
        return self._lasting

    def nodes_changed(self) -> None:
        self._lasting.clear()


class NullMemos(Memos):
    """Memos that keep nothing: every plugin search starts afresh (the reference engine)."""

    def pass_memo(self, pass_no: int, running: int, now: float) -> dict:
        return {}

    def vc_memo(self, vc: str, version: int, nodes: int) -> dict:
        return {}

    def lasting(self) -> dict:
        return {}
