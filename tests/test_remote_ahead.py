"""Read-ahead across batches: ``coalesce`` under an overread budget, the process's stage of
prefetched ranges, and :class:`~pickleshard.loading.ahead.ReadAhead`'s window."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pickleshard.io.base import COALESCE_GAP, coalesce
from pickleshard.io.remote.staging import StagedRanges, StageOwner, staging_for
from pickleshard.loading.ahead import FIRST_CHUNK, PULL, ReadAhead, after_prefetch, pulled_forward

ranges_st = st.lists(st.tuples(st.integers(0, 50_000), st.integers(0, 3000)), max_size=40)


@given(ranges_st, st.integers(0, 20_000), st.one_of(st.none(), st.integers(0, 30_000)))
def test_coalesce_covers_every_range_within_gap_and_budget(
    ranges: list[tuple[int, int]], gap: int, overread: int | None
) -> None:
    blocks = coalesce(ranges, gap, overread)
    seen = sorted(m for _, _, members in blocks for m in members)
    assert seen == list(range(len(ranges)))
    bridged = 0
    for lo, hi, members in blocks:
        assert lo == min(ranges[m][0] for m in members)
        assert hi == max(ranges[m][0] + ranges[m][1] for m in members)
        covered = sorted((ranges[m][0], ranges[m][0] + ranges[m][1]) for m in members)
        end = covered[0][1]
        for a, b in covered[1:]:
            assert a - end <= gap  # only gaps within the link's gap are read through
            bridged += a - end if a - end > COALESCE_GAP else 0  # a page through is free
            end = max(end, b)
    for (_, hi1, _), (lo2, _, _) in itertools.pairwise(blocks):
        assert lo2 > hi1  # blocks apart: touching or overlapping ranges share one
    if overread is not None:
        assert bridged <= overread
    else:
        assert blocks == coalesce(ranges, gap)


def test_coalesce_bridges_the_narrowest_gaps_first() -> None:
    ranges = [(0, 10), (10_000, 10), (15_000, 10), (60_000, 10), (60_100, 10)]
    # gaps 9,990, 4,990, 44,990 and 90 (under a page: always bridged)
    assert [m for *_, m in coalesce(ranges, 50_000, overread=5000)] == [[0], [1, 2], [3, 4]]
    assert [m for *_, m in coalesce(ranges, 50_000, overread=15_000)] == [[0, 1, 2], [3, 4]]
    assert [m for *_, m in coalesce(ranges, 50_000)] == [[0, 1, 2, 3, 4]]


def test_stage_serves_one_read_and_keeps_its_budget() -> None:
    stage = StagedRanges(budget=100)
    stage.put("a#1", [(0, b"x" * 40), (50, b"y" * 40)])
    assert stage.holds("a#1", 55, 10)
    assert not stage.holds("a#2", 55, 10)
    assert stage.take("a#1", 55, 65) == b"y" * 10
    assert stage.take("a#1", 55, 65) is None  # a staged range serves one read
    stage.put("a#1", [(100, b"z" * 50), (200, b"w" * 40)])  # 130 > 100: the oldest goes
    assert stage.take("a#1", 0, 40) is None
    assert stage.take("a#1", 200, 240) == b"w" * 40
    assert stage.stats.held == 50
    assert stage.stats.taken == 2
    assert stage.stats.dropped == 1


def test_a_released_owner_s_ranges_go_and_it_stages_no_more() -> None:
    stage = StagedRanges(budget=1000)
    mine, theirs = StageOwner(), StageOwner()
    with staging_for(mine):
        stage.put("a#1", [(0, b"x" * 10), (20, b"y" * 10)])
    with staging_for(theirs):
        stage.put("a#1", [(40, b"z" * 10)])
    stage.put("b#1", [(0, b"w" * 10)])  # no owner
    assert stage.take("a#1", 0, 10) == b"x" * 10  # taken: no longer the owner's
    assert stage.release(mine) == 1
    assert stage.stats.held == 20
    assert not stage.holds("a#1", 20, 10)
    assert stage.holds("a#1", 40, 10)
    assert stage.holds("b#1", 0, 10)
    with staging_for(mine):  # a fetch that was under way when its pass ended
        stage.put("a#1", [(60, b"v" * 10)])
    assert not stage.holds("a#1", 60, 10)
    stage.put("a#1", [(60, b"v" * 10)])  # outside the block: no owner, staged
    assert stage.holds("a#1", 60, 10)
    assert stage.release(theirs) == 1
    assert stage.stats.held == 20


@given(
    st.integers(1, 200),
    st.integers(1, 9),
    st.integers(1, 12),
    st.permutations(range(120)),
    st.booleans(),
)
def test_read_ahead_fetches_each_sample_once_before_its_batch_within_the_window(
    n: int, size: int, window: int, order: list[int], repeat: bool
) -> None:
    """Every sample is asked for once (an index drawn again after its fetch: again), by a fetch
    done before its batch is read; the batches drawn ahead stay within the window."""
    order = [i for i in order if i < n] + (order[:5] if repeat else [])
    batches = [(order[k : k + size], k) for k in range(0, len(order), size)]
    asked: list[list[int]] = []
    ahead = ReadAhead(iter(batches), asked.append, window_bytes=window * 8, batch_bytes=lambda: 8)
    cap = ahead.capacity()
    got: list[Any] = []
    while (drawn := ahead.next()) is not None:
        indices, state, fetched = drawn
        assert len(ahead.window) <= cap
        for done in fetched:
            done.result()
        assert set(indices) <= {i for a in asked for i in a}
        got.append((indices, state))
    ahead.close()
    assert got == batches
    fetched = sorted(i for a in asked for i in a)
    assert set(fetched) == set(order)
    assert fetched == sorted(order) if not repeat else len(fetched) <= len(order)
    assert all(len(set(a)) == len(a) for a in asked)


def test_read_ahead_chunks_grow_and_pull_the_window_forward() -> None:
    # batches of 4 samples 30 apart, batch k starting at 7k mod 30: the first chunk's samples
    # lie 7 apart, the gaps between them held by later batches
    batches = [([7 * k % 30 + 30 * j for j in range(4)], k) for k in range(30)]
    asked: list[list[int]] = []
    ahead = ReadAhead(iter(batches), asked.append, window_bytes=32 * 8, batch_bytes=lambda: 8)
    drawn = ahead.next()
    assert drawn is not None
    for done in drawn[2]:
        done.result()
    # the first chunk: FIRST_CHUNK batches, and the window's samples between them
    first = sorted(asked[0])
    assert {i for indices, _ in batches[:FIRST_CHUNK] for i in indices} < set(first)
    assert ahead.pulled > 0
    assert len(first) <= (1 + PULL) * 4 * FIRST_CHUNK
    while (drawn := ahead.next()) is not None:
        for done in drawn[2]:
            done.result()
    ahead.close()
    assert sorted(i for a in asked for i in a) == list(range(120))
    assert len(asked) < 30 // FIRST_CHUNK  # chunks grew: fewer fetches than batches


def test_pulled_forward_fills_the_narrowest_gaps_within_its_budget() -> None:
    later = {3, 5, 6, 11, 12, 13, 40}.__contains__
    # gaps: 2..4 holds 3 (1 not claimable: 2), 4..7 holds 5, 6 (none missing),
    # 10..14 holds 11-13, 20..41 holds 40 (20 samples between: too wide for max_gap=16)
    chunk = [1, 4, 7, 10, 14, 20, 41]
    assert pulled_forward(chunk, later, budget=10, max_gap=16) == [5, 6, 11, 12, 13, 3]
    assert pulled_forward(chunk, later, budget=2, max_gap=16) == [5, 6]
    assert pulled_forward(chunk, later, budget=0, max_gap=16) == []
    assert pulled_forward(chunk, later, budget=10, max_gap=20) == [5, 6, 11, 12, 13, 3, 40]


def test_read_ahead_off_without_prefetch_and_a_failed_prefetch_is_not_the_batch_error() -> None:
    ahead = ReadAhead(iter([([1], None), ([2], None)]), None, 1 << 20, lambda: 0)
    assert ahead.next() == ([1], None, ())
    assert ahead.next() == ([2], None, ())
    assert ahead.next() is None

    def boom(_: list[int]) -> None:
        raise OSError("the store said no")

    failing = ReadAhead(iter([([1], None)]), boom, 1 << 20, lambda: 0)
    drawn = failing.next()
    assert drawn is not None
    assert len(drawn[2]) == 1
    assert after_prefetch(drawn[2], lambda idx: idx)([1]) == [1]
    failing.close()
