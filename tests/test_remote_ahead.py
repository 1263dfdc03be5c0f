"""Read-ahead across batches: ``coalesce`` under an overread budget, the process's stage of
prefetched ranges, and :class:`~pickleshard.loading.ahead.ReadAhead`'s groups."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pickleshard.io.base import COALESCE_GAP, coalesce
from pickleshard.io.remote.staging import StagedRanges
from pickleshard.loading.ahead import FIRST_GROUP, ReadAhead, after_prefetch

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


def test_read_ahead_groups_batches_and_fetches_each_group_first() -> None:
    batches = [([k * 3, k * 3 + 1, k * 3 + 2], k) for k in range(60)]
    asked: list[list[int]] = []
    ahead = ReadAhead(iter(batches), asked.append, group_bytes=30 * 8, batch_bytes=lambda: 8)
    got: list[Any] = []
    while (drawn := ahead.next()) is not None:
        indices, state, fetched = drawn
        assert fetched is not None
        fetched.result()
        got.append((indices, state))
        # the group holding this batch was asked for before it is read
        assert any(set(indices) <= set(a) for a in asked)
    ahead.close()
    assert got == batches
    assert [len(a) // 3 for a in asked] == [FIRST_GROUP, 16, 30, 10]  # grown to the cap (30)
    assert sorted(i for a in asked for i in a) == list(range(180))


def test_read_ahead_off_without_prefetch_and_a_failed_prefetch_is_not_the_batch_error() -> None:
    ahead = ReadAhead(iter([([1], None), ([2], None)]), None, 1 << 20, lambda: 0)
    assert ahead.next() == ([1], None, None)
    assert ahead.next() == ([2], None, None)
    assert ahead.next() is None

    def boom(_: list[int]) -> None:
        raise OSError("the store said no")

    failing = ReadAhead(iter([([1], None)]), boom, 1 << 20, lambda: 0)
    drawn = failing.next()
    assert drawn is not None
    assert after_prefetch(drawn[2], lambda idx: idx)([1]) == [1]
    failing.close()
