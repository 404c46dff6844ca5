"""When the monitor evaluates a subject, and when it refits the subject's tree copy T_u.

A subject is evaluated (coverage, best_copy, warnings) when its query count reaches its
``next_eval``: first at ``first_eval`` queries (a customer's first rows can already copy an
easy model), then at ``min_refit``, then every ``max(min_refit, refit_fraction * n)``
queries, so an evaluation costs O(n log n) every Θ(n) queries and the amortised cost per
query stays flat. T_u (the costly part: a tree fit) keeps a schedule of its own at
``ig_refit_fraction``. An answer that shows a subject a leaf identity it had not seen brings
both forward (reveal-triggered evaluation: path-finding reveals leaves in bursts); the
automatic top-k pool (``auto_k``) is evaluated on the model's total query count. The
schedule depends only on query counts and revealed identities, so a replay of the query log
evaluates at the same points and reproduces the same statuses and history.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from mlaas_monitor.monitor.config import MonitorConfig
from mlaas_monitor.monitor.subject import SubjectState

REVEAL_GAP = 5  # queries between two evaluations, at least, when a new leaf identity brings one forward
LINK_BATCH = 512  # rows waiting for the link index before it is brought up to date anyway


def next_point(n: int, min_refit: int, fraction: float) -> int:
    """The query count of the next evaluation (or refit) after one at n: min_refit while an
    early first evaluation (first_eval) came before it, then max(min_refit, fraction * n) later."""
    return min_refit if n < min_refit else n + max(min_refit, math.ceil(fraction * n))


class EvaluationSchedule:
    """One model's evaluation schedule. The per-subject points (``next_eval``,
    ``next_refit``, ``evaluated_at``) live on each ``SubjectState`` (persisted with it); the
    model-wide clock of the automatic pool lives here."""

    def __init__(self, config: MonitorConfig) -> None:
        self.config = config  # the model's monitor settings (replaced whole when the owner patches them)
        self.total_queries = 0  # answered rows of the model ingested so far: the automatic pool's clock
        self.next_auto = 0  # total_queries at which the automatic top-k pool is next evaluated

    def first(self) -> int:
        """A new subject's first evaluation and refit: after first_eval queries, not at the
        first one (most accounts send few queries, and their statuses would be noise)."""
        return min(self.config.first_eval, self.config.min_refit)

    def due(self, s: SubjectState, n_queries: int | None = None) -> bool:
        """Whether the subject (with ``n_queries``, a group's members' total) is due."""
        return (s.n_queries if n_queries is None else n_queries) >= s.next_eval

    def any_due(self, subjects: Iterable[SubjectState]) -> bool:
        return any(s.n_queries >= s.next_eval for s in subjects)

    def refit_due(self, s: SubjectState, refit: bool) -> bool:
        """Whether this evaluation refits T_u: on its own schedule, or when told to."""
        return refit or s.n_queries >= s.next_refit

    def refitted(self, s: SubjectState) -> None:
        c = self.config
        s.next_refit = next_point(s.n_queries, c.min_refit, c.ig_refit_fraction)

    def evaluated(self, s: SubjectState) -> None:
        c = self.config
        s.evaluated_at = s.n_queries
        s.next_eval = next_point(s.n_queries, c.min_refit, c.refit_fraction)

    def revealed(self, s: SubjectState) -> None:
        """An answer showed the subject a leaf identity it had not seen: its evaluation (and
        refit) is due now, not only on the query-count schedule. After its first evaluation
        (before it the status is noise), at least REVEAL_GAP queries after the previous one
        (a burst of new leaves costs one). The refit too: a copy scored with a stale tree
        would sit below what the answers give (monitor-eval measured 0.41 below on German
        credit's benign users without it)."""
        if s.evaluated_at and self.config.reveal_eval:
            at = max(s.n_queries, s.evaluated_at + REVEAL_GAP)
            s.next_eval = min(s.next_eval, at)
            s.next_refit = min(s.next_refit, at)

    def link_due(self, pending_rows: int, something_due: bool) -> bool:
        """Link (and pool) the waiting rows when something is due, or when enough wait (a
        pool's own schedule needs its rows: a coalition of accounts too short to be due
        would otherwise reach the pool LINK_BATCH rows late). A function of the event
        sequence, so a replay links at the same points."""
        c = self.config
        return something_due or pending_rows >= (min(LINK_BATCH, c.min_refit) if c.pool else LINK_BATCH)

    def ingested(self, rows: int) -> None:
        self.total_queries += rows

    def auto_due(self, n_users: int, force: bool) -> bool:
        """Whether the automatic top-k pool is evaluated now (auto_k >= 2 and two users)."""
        if self.config.auto_k < 2 or n_users < 2:
            return False
        return force or self.total_queries >= self.next_auto

    def auto_idle(self) -> bool:
        """The automatic pool cannot be due on this event (the per-event fast path)."""
        return self.config.auto_k < 2 or self.total_queries < self.next_auto

    def auto_evaluated(self) -> None:
        """The automatic pool's next point: every 4 * min_refit queries of the model, or
        refit_fraction of them, whichever is more."""
        c = self.config
        self.next_auto = self.total_queries + max(4 * c.min_refit, math.ceil(c.refit_fraction * self.total_queries))
