"""PRADA (Juuti, Szyller, Marchal, Asokan, "PRADA: Protecting Against DNN Model Stealing
Attacks", EuroS&P 2019) on arrays: a signal of intent, beside the extraction statuses.

Per user, each query's minimum distance to the user's earlier queries of the same predicted
class (the class's *growing set*) is recorded. A query joins the growing set when its
distance exceeds the class's threshold, max over time of mean − std of the distances that
admitted earlier members. Natural queries give distances close to normally distributed;
synthetic ones (line searches, uniform samples, probes differing in one feature) do not.
The Shapiro–Wilk statistic W of the recorded distances measures that; an alarm is W < δ.

Distances are over the model card's domain: a numeric feature counts its difference over
its range, a categorical one 1 when the categories differ (a one-hot L2 without the √2).
The status exported is 1 − W (0 for a perfectly normal stream), so that, like the others,
higher means more alarming: an alarm at δ is a status ≥ 1 − δ.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

MAX_WINDOW = 5000  # Shapiro-Wilk's p-value is exact up to 5000 samples; W is used on the latest ones
FOLD_BLOCK = 256  # rows whose distances to a growing set are computed at once (bounds the arrays)


@dataclass
class _Growing:
    """One class's growing set in a buffer that doubles (numeric and categorical parts), and
    the running mean and variance (Welford) of the distances that admitted its members."""

    num: np.ndarray  # (capacity, numeric features) the set's rows, numeric part
    cat: np.ndarray  # (capacity, categorical features) their categorical part
    n: int = 0  # rows in the set (the buffers' first n)
    count: int = 0  # distances admitted (Welford's count)
    mean: float = 0.0  # their running mean
    m2: float = 0.0  # their running sum of squared deviations
    threshold: float = 0.0  # a distance above this adds the query to the set: max over time of mean - sd

    def add(self, num: np.ndarray, cat: np.ndarray) -> None:
        if self.n == self.num.shape[0]:
            self.num = np.concatenate([self.num, np.empty_like(self.num)])
            self.cat = np.concatenate([self.cat, np.empty_like(self.cat)])
        self.num[self.n], self.cat[self.n] = num, cat
        self.n += 1

    def admit(self, d: float) -> None:
        self.count += 1
        delta = d - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (d - self.mean)
        self.threshold = max(self.threshold, self.mean - (self.m2 / self.count) ** 0.5)


@dataclass
class PradaState:
    """One user's PRADA state: the growing sets and the distances."""

    growing: dict[int, _Growing] = field(default_factory=dict)  # by answered class
    # Per query, its distance to its class's growing set, in order
    distances: list[float] = field(default_factory=list)
    done: int = 0  # queries folded in


class Prada:
    """Distances for one model's feature domain."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, categorical: np.ndarray) -> None:
        span = np.where(hi > lo, hi - lo, 1.0)
        self.scale = np.where(categorical, 1.0, 1.0 / span)  # (d,) per feature: 1 / its domain range (categorical: 1)
        self.categorical = np.asarray(categorical, dtype=bool)  # (d,) bool: the feature is categorical

    def fold(self, st: PradaState, X: np.ndarray, labels: np.ndarray) -> None:
        """Add queries (rows of X, in order, with the class each was answered) to ``st``.

        The same as taking the rows one by one, in fewer numpy calls: per class, the
        distances of a block of rows to the growing set are one array operation, and a row
        admitted to the set lowers the later rows' minima with one more (admissions are
        rare: tens per thousand queries)."""
        Z = np.asarray(X, dtype=np.float64) * self.scale
        num, cat = Z[:, ~self.categorical], Z[:, self.categorical]
        labels = np.asarray(labels)
        out = np.full(labels.shape[0], np.nan)
        for c in dict.fromkeys(labels.tolist()):
            idx = np.flatnonzero(labels == c)
            g = st.growing.get(c)
            if g is None:
                g = st.growing[c] = _Growing(np.empty((8, num.shape[1])), np.empty((8, cat.shape[1])))
                g.add(num[idx[0]], cat[idx[0]])  # the first query of a class only starts its set
                idx = idx[1:]
            for lo in range(0, idx.shape[0], FOLD_BLOCK):
                block = idx[lo : lo + FOLD_BLOCK]
                bn, bc = num[block], cat[block]
                d2 = _sq_dist(g.num[: g.n], g.cat[: g.n], bn, bc).min(axis=1)
                for k in range(block.shape[0]):
                    d = math.sqrt(d2[k])
                    out[block[k]] = d
                    if d > g.threshold:
                        g.add(bn[k], bc[k])
                        g.admit(d)
                        if k + 1 < block.shape[0]:
                            np.minimum(d2[k + 1 :], _sq_dist(bn[k : k + 1], bc[k : k + 1], bn[k + 1 :], bc[k + 1 :])[:, 0],
                                       out=d2[k + 1 :])  # fmt: skip
        st.distances += out[~np.isnan(out)].tolist()  # in query order
        st.done += X.shape[0]


def _sq_dist(A_num: np.ndarray, A_cat: np.ndarray, B_num: np.ndarray, B_cat: np.ndarray) -> np.ndarray:
    """(len(B), len(A)) squared distances: numeric differences squared, plus one per
    differing category."""
    diff = B_num[:, None, :] - A_num[None, :, :]
    d2 = np.einsum("ijk,ijk->ij", diff, diff)
    if A_cat.shape[1]:
        d2 += (B_cat[:, None, :] != A_cat[None, :, :]).sum(axis=2)
    return d2


def shapiro_w(distances: list[float]) -> float | None:
    """Shapiro–Wilk W of the latest distances (None with fewer than 3). A constant stream
    (the same query again and again) is as far from natural as it gets: W = 0."""
    if len(distances) < 3:
        return None
    D = np.asarray(distances[-MAX_WINDOW:], dtype=np.float64)
    if np.ptp(D) == 0:
        return 0.0
    from scipy.stats import shapiro

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns about ties and N > 5000; W is still what we want
        return float(shapiro(D).statistic)


def prada_status(st: PradaState, min_distances: int) -> float:
    """1 − W once the user has at least ``min_distances`` distances, else 0 (no evidence)."""
    if len(st.distances) < min_distances:
        return 0.0
    w = shapiro_w(st.distances)
    return 0.0 if w is None else float(min(1.0, max(0.0, 1.0 - w)))
