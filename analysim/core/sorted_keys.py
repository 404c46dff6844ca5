"""Reads of sorted key lists (sortedcontainers.SortedList) that the scheduling passes make.

A pass reads the scheduling queue's lists without changing them (changes during a pass are
deferred: see SchedulingQueue), and asks "the first key past this one" and "every key from this
one on" millions of times on a long run. SortedList's own ``bisect_right`` + ``__getitem__`` and
``irange`` answer both through its positional index, which they build and walk to give a position
that is then only used to read the key back; these read its sublists (``_lists``, ascending,
concatenated in order) and their maxima (``_maxes``: the last key of each sublist) directly.
Measured when it was introduced (BENCHMARKS-HISTORY.md, "Eleventh round"): the index walk cost more than
the rest of the merges' jumps.

Those two fields are private to sortedcontainers: pyproject.toml pins the release line they were
read from (2.4), and tests/test_engine_lists.py checks every function here against SortedList's
public API on lists of many sublists.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterator

from sortedcontainers import SortedList  # type: ignore[import-untyped, import-not-found]


def first_key(keys: SortedList) -> tuple:
    """The smallest key of a non-empty list (``keys[0]``)."""
    return keys._lists[0][0]


def first_after(keys: SortedList, after: tuple) -> tuple | None:
    """The first of ``keys`` greater than ``after`` (None: none is): ``keys[keys.bisect_right(after)]``."""
    maxes = keys._maxes  # the largest key of each of its sublists, ascending
    pos = bisect.bisect_right(maxes, after)
    if pos == len(maxes):
        return None
    sub = keys._lists[pos]
    return sub[bisect.bisect_right(sub, after)]


def cursor_after(keys: SortedList, after: tuple) -> tuple[tuple, int, int] | None:
    """``first_after``'s key with where it is: (key, sublist, index in it), a cursor that
    ``cursor_next`` moves on (None: no key is greater). (first_after stays apart for its callers
    that want the key alone, on hot paths, without the tuple.)"""
    maxes = keys._maxes
    pos = bisect.bisect_right(maxes, after)
    if pos == len(maxes):
        return None
    sub = keys._lists[pos]
    i = bisect.bisect_right(sub, after)
    return sub[i], pos, i


def cursor_next(keys: SortedList, pos: int, i: int) -> tuple[tuple, int, int] | None:
    """The cursor of the key after the one at (``pos``, ``i``) (None: it was the last), for a list
    that did not change since the cursor was made: a step, where ``first_after`` bisects."""
    lists = keys._lists
    sub = lists[pos]
    i += 1
    if i < len(sub):
        return sub[i], pos, i
    pos += 1
    if pos < len(lists):
        return lists[pos][0], pos, 0
    return None


def keys_from(keys: SortedList, start: tuple, inclusive: bool) -> Iterator[tuple]:
    """The keys from ``start`` on (past it unless ``inclusive``), as ``keys.irange(start)`` gives
    them, for a list that does not change while they are read."""
    maxes = keys._maxes
    pos = (bisect.bisect_left if inclusive else bisect.bisect_right)(maxes, start)
    if pos == len(maxes):
        return iter(())
    lists = keys._lists
    sub = lists[pos]
    i = (bisect.bisect_left if inclusive else bisect.bisect_right)(sub, start)
    return itertools.chain(itertools.islice(sub, i, None), *lists[pos + 1:])


def file_key(lists: dict, bucket: object, key: tuple) -> None:
    """Add ``key`` to the list of ``bucket`` (created on first use)."""
    mine = lists.get(bucket)
    if mine is None:
        mine = lists[bucket] = SortedList()
    mine.add(key)


def unfile_key(lists: dict, bucket: object, key: tuple) -> None:
    """Remove ``key`` from the list of ``bucket``, and the list once empty (an index keeps no empty
    list: a merge over its lists then never starts an empty one)."""
    mine = lists[bucket]
    mine.remove(key)
    if not mine:
        del lists[bucket]


def merge_heap(lists: dict) -> list:
    """(first key, bucket, generation 0, iterator) for each non-empty list, as a heap: the start
    of a k-way merge. Keys are unique across the lists: two entries tie on key and bucket only
    across the generations of a merge's jump, which the generation settles, so iterators are
    never compared."""
    heap = []
    for bucket, keys in lists.items():
        it = iter(keys)
        first = next(it, None)
        if first is not None:
            heap.append((first, bucket, 0, it))
    heapq.heapify(heap)
    return heap


def push_from(heap: list, bucket: object, keys: Iterator[tuple], gen: int) -> None:
    """Put ``keys``' next key (if any) into a merge heap as ``bucket``'s entry of generation ``gen``."""
    key = next(keys, None)
    if key is not None:
        heapq.heappush(heap, (key, bucket, gen, keys))  # (a stale entry may share key and bucket, not gen)


class NextKeys:
    """The first key past a moving point in any of some lists that do not change: a heap of each
    list's first key past the last point asked (keys are unique across the lists).

    Invariant: ``heap`` holds, for each list with a key past ``after``, its first such key."""

    __slots__ = ("after", "heap")

    def __init__(self, lists: list[SortedList], after: tuple) -> None:
        self.after = after  # the last point asked (keys only move past it)
        self.heap: list[tuple[tuple, SortedList]] = []  # (a list's first key past ``after``, the list)
        for keys in lists:
            first = first_after(keys, after)
            if first is not None:
                self.heap.append((first, keys))
        heapq.heapify(self.heap)

    def next_after(self, after: tuple) -> tuple | None:
        """The first key past ``after``, which is no earlier than the last point asked."""
        heap = self.heap
        while heap and heap[0][0] <= after:
            keys = heap[0][1]
            first = first_after(keys, after)
            if first is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (first, keys))
        self.after = after
        return heap[0][0] if heap else None
