"""The core's reads of sortedcontainers' SortedList internals (sorted_keys.py) agree with its public API,
for the release line pyproject.toml pins."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from analysim.core.sorted_keys import cursor_after, cursor_next, first_key
from analysim.core.sorted_keys import first_after as _first_after
from analysim.core.sorted_keys import keys_from as _keys_from

KEYS = st.tuples(st.tuples(st.integers(-3, 3), st.floats(0, 10, allow_nan=False)), st.integers(0, 10_000))


@settings(max_examples=300, deadline=None)
@given(st.lists(KEYS, unique_by=lambda k: k[1], max_size=3000), KEYS, st.integers(4, 64))
def test_first_after_is_the_key_at_bisect_right(keys, after, load):
    # Small loads make many sublists, as a long queue does.
    sl = SortedList(keys)
    sl._reset(load)
    i = sl.bisect_right(after)
    assert _first_after(sl, after) == (sl[i] if i < len(sl) else None)
    if sl:
        assert first_key(sl) == sl[0]
    for k in keys[:20]:  # keys present: the next one, never itself
        j = sl.bisect_right(k)
        assert _first_after(sl, k) == (sl[j] if j < len(sl) else None)



@settings(max_examples=300, deadline=None)
@given(st.lists(KEYS, unique_by=lambda k: k[1], max_size=3000), KEYS, st.integers(4, 64))
def test_a_cursor_walks_the_keys_past_a_point_as_irange_gives_them(keys, after, load):
    sl = SortedList(keys)
    sl._reset(load)
    walked = []
    cur = cursor_after(sl, after)
    while cur is not None:
        walked.append(cur[0])
        cur = cursor_next(sl, cur[1], cur[2])
    assert walked == list(sl.irange(minimum=after, inclusive=(False, False)))


@settings(max_examples=300, deadline=None)
@given(st.lists(KEYS, unique_by=lambda k: k[1], max_size=3000), KEYS, st.integers(4, 64))
def test_keys_from_are_irange(keys, start, load):
    sl = SortedList(keys)
    sl._reset(load)
    for s in [start, *keys[:10]]:  # (keys present: from it, or past it)
        assert list(_keys_from(sl, s, True)) == list(sl.irange(minimum=s))
        assert list(_keys_from(sl, s, False)) == list(sl.irange(minimum=s, inclusive=(False, False)))
