"""What an attacker truly holds, as the attack goes: the balanced fidelity of the best copy
the suite knows how to build from its answers (monitor-eval's truth)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mlaas_monitor.monitor.attacks import (
    BoxRebuild,
    Oracle,
    TreeRebuild,
    box_copies,
    boxes_from_oracle,
    fidelities,
    rebuild_from_log,
)


def best_copy(copies: list[Any], X: np.ndarray, truth: list[Any]) -> tuple[float, float]:
    """(balanced fidelity, plain agreement) of the best of these copies (None: not built)."""
    return max(fidelities(c, X, truth) for c in copies if c is not None)


class FidelityTracker:
    """What the attacker truly holds, as the attack goes: the balanced fidelity of the best
    of the copies the suite knows how to build from its answers — the leaf boxes
    path-finding discovered, the boxes of the leaf identities it was told (whatever it
    queried), path-finding's reading of those answers (star boxes) and a tree fitted on every
    answer it got. Recorded after each request that added a leaf for path-finding, and every
    ~2 % of queries; each point is the best copy so far (a copy built once stays built)."""

    def __init__(self, X: np.ndarray, truth: list[Any]) -> None:
        self.X, self.truth = X, truth  # the held-out rows every copy is scored on, and the model's labels of them
        self.curve: list[tuple[int, float]] = []  # balanced
        self.raw: list[tuple[int, float]] = []  # plain agreement
        self._next = 1  # query count of the next periodic point
        self._leaves = -1  # leaves path-finding had at the last point (-1: none recorded)
        # path-finding's own rebuild, when the attacker is one (None: not path-finding)
        self.box: BoxRebuild | None = None
        self.explored: list[tuple[int, int]] = []  # (queries, leaves path-finding had explored by then)

    def _record(self, n: int, rebuilt: Any, oracle: Oracle) -> None:
        best = best_copy([rebuilt, rebuild_from_log(oracle), *boxes_from_oracle(oracle)], self.X, self.truth)
        # The best copy so far: the attacker keeps the copies it built from fewer answers.
        self.curve.append((n, max(best[0], self.curve[-1][1]) if self.curve else best[0]))
        self.raw.append((n, best[1]))

    def __call__(self, oracle: Oracle) -> None:
        if self.box is not None:
            if not self.explored or self.explored[-1][1] != len(self.box.leaves):
                self.explored.append((oracle.queries, len(self.box.leaves)))
            # When a leaf is added (the box copy changes), and as the answers pile up (the
            # tree copy changes).
            if len(self.box.leaves) != self._leaves or oracle.queries >= self._next:
                self._leaves = len(self.box.leaves)
                self._record(oracle.queries, self.box, oracle)
                self._next = oracle.queries + max(10, oracle.queries // 50)
            return
        if oracle.queries >= self._next:
            self._record(oracle.queries, None, oracle)
            self._next = oracle.queries + max(10, oracle.queries // 50)

    def truth_at(self, oracle: Oracle, points: list[int]) -> list[tuple[int, float]]:
        """The balanced fidelity of the best copy from exactly the first n queries, for each
        n in ``points`` (the monitor's evaluation points): what its status is compared with."""
        X = np.concatenate(oracle.log_X) if oracle.log_X else np.empty((0, oracle.domain.d))
        out = []
        for n in points:
            copies: list[Any] = [TreeRebuild(X[:n], oracle.log_labels[:n]),
                                 *box_copies(oracle.domain, X[:n], oracle.log_labels[:n], oracle.log_ident[:n])]  # fmt: skip
            if self.box is not None:
                done = max((c for q, c in self.explored if q <= n), default=0)
                copies.append(BoxRebuild(self.box.domain, self.box.leaves[:done]))
            out.append((n, best_copy(copies, self.X, self.truth)[0]))
        return out

    def finish(self, oracle: Oracle, rebuilt: Any) -> float:
        if self.curve and self.curve[-1][0] == oracle.queries:
            self.curve.pop()
            self.raw.pop()
        self._record(oracle.queries, rebuilt, oracle)
        return self.curve[-1][1]
