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

import warnings
from dataclasses import dataclass, field

import numpy as np

MAX_WINDOW = 5000  # Shapiro-Wilk's p-value is exact up to 5000 samples; W is used on the latest ones


@dataclass
class _Growing:
    """One class's growing set in a buffer that doubles (numeric and categorical parts), and
    the running mean and variance (Welford) of the distances that admitted its members."""

    num: np.ndarray
    cat: np.ndarray
    n: int = 0
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    threshold: float = 0.0

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
    distances: list[float] = field(default_factory=list)
    done: int = 0  # queries folded in


class Prada:
    """Distances for one model's feature domain."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, categorical: np.ndarray) -> None:
        span = np.where(hi > lo, hi - lo, 1.0)
        self.scale = np.where(categorical, 1.0, 1.0 / span)
        self.categorical = np.asarray(categorical, dtype=bool)

    def fold(self, st: PradaState, X: np.ndarray, labels: np.ndarray) -> None:
        """Add queries (rows of X, in order, with the class each was answered) to ``st``."""
        Z = np.asarray(X, dtype=np.float64) * self.scale
        num, cat = Z[:, ~self.categorical], Z[:, self.categorical]
        for zn, zc, c in zip(num, cat, labels.tolist(), strict=True):
            g = st.growing.get(c)
            if g is None:
                g = st.growing[c] = _Growing(np.empty((8, zn.shape[0])), np.empty((8, zc.shape[0])))
                g.add(zn, zc)
                continue
            diff = g.num[: g.n] - zn
            d2 = np.einsum("ij,ij->i", diff, diff)
            if zc.shape[0]:
                d2 += np.count_nonzero(g.cat[: g.n] != zc, axis=1)
            d = float(np.sqrt(d2.min()))
            st.distances.append(d)
            if d > g.threshold:
                g.add(zn, zc)
                g.admit(d)
        st.done += X.shape[0]


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
