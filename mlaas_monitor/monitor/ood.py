"""Out-of-distribution share: a second signal of intent, for what PRADA cannot see.

PRADA asks whether a user's stream of nearest-query distances looks normal. On tabular
data with categorical features, uniform random queries give distances that concentrate
(many independent coordinates) and look *more* normal than natural rows, which cluster;
so PRADA misses the random attacker (see docs/monitor.md). What random and path-finding
queries share is that they leave the data distribution: a domain-edge probe or a uniform
draw lies far from every real row. The owner's validation set S is a sample of that
distribution, so the reference is S's own leave-one-out nearest-neighbour distance: its
``quantile`` (0.95) is the radius τ beyond which 5 % of natural rows fall (S's first 1,000
rows at most, which bounds the cost per query). A user's status is
the share of its queries farther than τ from every row of S, above that 5 %, rescaled:
(share − (1 − quantile)) / quantile, clipped to [0, 1].

Distances are PRADA's (numeric differences over the domain range, 1 per differing category).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QUANTILE = 0.95
CHUNK = 256  # queries per distance block (bounds memory at CHUNK x |S|)
MAX_REFERENCE = 1000  # rows of S the distances are taken to (S is already a random sample)


@dataclass
class OodState:
    far: int = 0  # queries beyond tau
    done: int = 0  # queries folded in


class Ood:
    def __init__(self, S: np.ndarray, scale: np.ndarray, categorical: np.ndarray, quantile: float = QUANTILE) -> None:
        # (m, d) the reference rows of S, scaled (at most MAX_REFERENCE)
        self.S = np.asarray(S, np.float64)[:MAX_REFERENCE] * scale
        # Per feature: the scale of its distances, whether it is categorical; and the quantile of S's nearest-neighbour distances tau is
        self.scale, self.cat, self.quantile = scale, np.asarray(categorical, bool), quantile
        n = self.S.shape[0]
        if n < 2:
            self.tau = np.inf
            return
        nn = np.concatenate([self._nearest(self.S[i : i + CHUNK], exclude=np.arange(i, min(n, i + CHUNK)))
                             for i in range(0, n, CHUNK)])  # fmt: skip
        # A query farther than this from every row of S is out of distribution
        self.tau = float(np.quantile(nn, quantile))

    def _nearest(self, Z: np.ndarray, exclude: np.ndarray | None = None) -> np.ndarray:
        num = ~self.cat
        d2 = np.zeros((Z.shape[0], self.S.shape[0]))
        if num.any():
            a, b = Z[:, num], self.S[:, num]
            d2 += np.maximum(0.0, (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T)
        for j in np.flatnonzero(self.cat):
            d2 += Z[:, j][:, None] != self.S[:, j][None, :]
        if exclude is not None:
            d2[np.arange(Z.shape[0]), exclude] = np.inf
        return np.sqrt(d2.min(axis=1))

    def far(self, X: np.ndarray) -> np.ndarray:
        """Per row: whether it lies farther than tau from every row of S (bool array)."""
        Z = np.asarray(X, np.float64) * self.scale
        out = np.zeros(Z.shape[0], bool)
        for i in range(0, Z.shape[0], CHUNK):
            out[i : i + CHUNK] = self._nearest(Z[i : i + CHUNK]) > self.tau
        return out

    def fold(self, st: OodState, X: np.ndarray) -> None:
        st.far += int(np.count_nonzero(self.far(X)))
        st.done += X.shape[0]

    def status(self, st: OodState, min_queries: int) -> float:
        if st.done < min_queries or st.done == 0:
            return 0.0
        base = 1.0 - self.quantile
        return float(min(1.0, max(0.0, (st.far / st.done - base) / (1.0 - base))))
