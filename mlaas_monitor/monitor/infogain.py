"""Information-gain status and fidelity (Kesarwani et al., ACSAC 2018), on arrays only.

IG(S, T) = H(S) - sum over leaves l of T of |S_l|/|S| * H(S_l), with S the owner's
validation set labelled by the owner's model. The owner's tree puts S into pure leaves, so
IG(S, T_owner) = H(S) and a user's status is IG(S, T_u) / H(S), clipped to [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlaas_monitor.tree import Tree, from_sklearn


def entropy(labels: np.ndarray) -> float:
    """Shannon entropy (bits) of a label vector; 0 for an empty one."""
    labels = np.asarray(labels)
    if labels.size == 0:
        return 0.0
    if labels.dtype.kind in "iu" and labels.min() >= 0:
        counts = np.bincount(labels).astype(np.float64)
        counts = counts[counts > 0]
    else:
        counts = np.unique(labels, return_counts=True)[1].astype(np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def information_gain(partition: np.ndarray, labels: np.ndarray) -> float:
    """IG of splitting ``labels`` by ``partition`` (a leaf id per element)."""
    partition, labels = np.asarray(partition), np.asarray(labels)
    n = labels.size
    if n == 0:
        return 0.0
    if partition.dtype.kind in "iu" and labels.dtype.kind in "iu" and partition.min() >= 0 and labels.min() >= 0:
        part, lab = partition.astype(np.int64), labels.astype(np.int64)  # leaf ids, class indices: no unique()
    else:
        part, lab = np.unique(partition, return_inverse=True)[1], np.unique(labels, return_inverse=True)[1]
    # One contingency table (leaves x classes) instead of a loop over leaves.
    k = int(lab.max()) + 1
    table = np.bincount(part * k + lab, minlength=(int(part.max()) + 1) * k).reshape(-1, k).astype(np.float64)
    table = table[table.sum(axis=1) > 0]
    sizes = table.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = table / sizes[:, None]
        h_leaf = -np.nansum(np.where(p > 0, p * np.log2(p), 0.0), axis=1)
    return max(0.0, entropy(labels) - float((sizes / n * h_leaf).sum()))


def ig_status(ig_user: float, ig_owner: float) -> float:
    """IG(S, T_u) / IG(S, T_owner) clipped to [0, 1]; 0 when S holds a single class."""
    if ig_owner <= 0.0:
        return 0.0
    return float(min(1.0, max(0.0, ig_user / ig_owner)))


_HASH_SEED = np.random.default_rng(0x5EED).integers(1, 2**63, size=4096, dtype=np.uint64) | np.uint64(1)


def canonical_order(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A row order that depends only on the multiset of (row, label): pooled queries of
    colluders and the same queries from one user then fit the very same tree.

    Rows are ordered by a 64-bit hash of their float32 bits and label (one pass, instead of
    a lexsort over every column, which cost more than the fit); rows with equal hashes are,
    but for a 2^-64 chance, equal rows, which are interchangeable."""
    bits = np.ascontiguousarray(X, dtype=np.float32).view(np.uint32).astype(np.uint64)
    d = bits.shape[1]
    if d + 1 > _HASH_SEED.shape[0]:
        return np.lexsort(np.column_stack([X, y]).T[::-1])
    with np.errstate(over="ignore"):
        h = (bits * _HASH_SEED[:d]).sum(axis=1, dtype=np.uint64) + y.astype(np.uint64) * _HASH_SEED[d]
    return np.argsort(h, kind="stable")


def fit_subject_tree(X: np.ndarray, y: np.ndarray, seed: int = 0) -> Tree | None:
    """T_u: a tree fitted (to purity) on a subject's queries and the labels it was told.

    None without queries. A single observed label gives a one-leaf tree (IG 0)."""
    if X.shape[0] == 0:
        return None
    if np.all(y == y[0]):
        # One label seen: T_u is a single leaf. Built here, because scikit-learn's fixed
        # cost (~1 ms of target checks) would dominate every new user's first evaluation.
        value = np.zeros((1, int(y[0]) + 1))
        value[0, int(y[0])] = 1.0
        return Tree(np.array([-1], np.int32), np.array([-1], np.int32), np.array([-2], np.int32),
                    np.array([-2.0]), value, np.array([X.shape[0]], np.int64))  # fmt: skip
    import sklearn
    from sklearn.tree import DecisionTreeClassifier

    order = canonical_order(X, y)
    Xs = np.ascontiguousarray(X[order], dtype=np.float32)  # the tree's own dtype: no copy in fit
    ys = y[order].astype(np.int64)
    # Our arrays are finite float32 by construction (the gateway validated them); skipping
    # scikit-learn's checks halves the cost of the many small fits.
    with sklearn.config_context(skip_parameter_validation=True, assume_finite=True):
        est = DecisionTreeClassifier(random_state=seed)
        est.fit(Xs, ys, check_input=False)
    tree = from_sklearn(est)
    # Map the estimator's class positions back to the owner's class indices, so that
    # argmax over value columns is an owner class index.
    n_owner = int(ys.max()) + 1
    value = np.zeros((tree.n_nodes, n_owner), dtype=np.float64)
    value[:, est.classes_.astype(np.int64)] = tree.value
    return Tree(tree.left, tree.right, tree.feature, tree.threshold, value, tree.n_samples)


@dataclass(frozen=True)
class SubjectScores:
    ig: float  # extraction status by information gain, in [0, 1]
    fidelity: float  # balanced agreement of T_u with the owner's model on S, beyond a constant copy


def score_tree(tree: Tree | None, S: np.ndarray, owner_labels: np.ndarray, ig_owner: float) -> SubjectScores:
    """IG status and fidelity of a subject's tree on the validation set S."""
    if tree is None or S.shape[0] == 0:
        return SubjectScores(0.0, 0.0)
    leaves = tree.apply(S)
    ig = ig_status(information_gain(leaves, owner_labels), ig_owner)
    predicted = tree.value[leaves].argmax(axis=1)
    k = max(2, int(np.unique(owner_labels).size))
    return SubjectScores(ig, extent(balanced_agreement(predicted, owner_labels), k))


def extent(bf: float, k: int) -> float:
    """Balanced fidelity on the status scale: 0 for a constant copy (balanced agreement 1/K),
    1 for an exact one; clipped to [0, 1]."""
    return float(min(1.0, max(0.0, (bf - 1.0 / k) / (1.0 - 1.0 / k))))


def balanced_agreement(predicted: np.ndarray, truth: np.ndarray) -> float:
    """Balanced fidelity: the mean over the owner's classes of the share of that class's
    rows the copy labels alike. A constant copy scores 1/K whatever the label skew."""
    truth = np.asarray(truth)
    if truth.size == 0:
        return 0.0
    classes, inv = np.unique(truth, return_inverse=True)
    hits = np.bincount(inv, weights=(np.asarray(predicted) == truth).astype(np.float64), minlength=len(classes))
    return float(np.mean(hits / np.bincount(inv, minlength=len(classes))))
