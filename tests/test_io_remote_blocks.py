"""The remote block cache (:mod:`pickleshard.io.remote.blocks`) without a server: a fetch that
slices a bytes object and records what it was asked for. The oracle is the slice itself."""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence

import pytest

from pickleshard.io.lru import CacheStats
from pickleshard.io.remote.blocks import BlockCache

DATA = bytes(range(256)) * 40  # 10,240 bytes


class Fetcher:
    def __init__(self, data: bytes = DATA) -> None:
        self.data = data
        self.asked: list[list[tuple[int, int]]] = []

    def __call__(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self.asked.append(list(ranges))
        return [self.data[lo:hi] for lo, hi in ranges]


def test_reads_equal_the_slice_and_fetch_only_missing_blocks() -> None:
    cache, fetch = BlockCache(4096, block_size=1024), Fetcher()
    assert cache.read("k", len(DATA), 1000, 100, fetch) == DATA[1000:1100]
    assert fetch.asked == [[(0, 1024), (1024, 2048)]]
    assert cache.read("k", len(DATA), 1500, 1000, fetch) == DATA[1500:2500]
    assert fetch.asked[1:] == [[(2048, 3072)]]  # block 1 was held
    assert cache.read("k", len(DATA), len(DATA) - 5, 100, fetch) == DATA[-5:]  # cut at the end
    assert cache.read("k", len(DATA), len(DATA), 10, fetch) == b""
    s = cache.stats
    assert (s.hits, s.misses, s.loads, s.evictions) == (1, 4, 4, 0)
    assert cache.held == s.bytes_used == s.bytes_loaded == 4 * 1024


def test_the_budget_holds_and_least_recently_used_blocks_go() -> None:
    cache, fetch = BlockCache(2048, block_size=1024), Fetcher()
    for offset in (0, 1024, 0, 2048):  # block 1 is the least recently used when 2 arrives
        cache.read("k", len(DATA), offset, 1, fetch)
        assert cache.held <= 2048
    cache.read("k", len(DATA), 0, 1, fetch)
    assert len(fetch.asked) == 3  # block 0 still held
    cache.read("k", len(DATA), 1024, 1, fetch)
    assert len(fetch.asked) == 4
    assert cache.stats.evictions == 2


def test_an_object_cut_short_is_read_but_not_kept() -> None:
    cache, fetch = BlockCache(4096, block_size=1024), Fetcher(DATA[:1024])
    assert cache.read("k", len(DATA), 1024, 10, fetch) == b""
    assert cache.held == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="budget >= block_size"):
        BlockCache(100, block_size=1024)


def test_pickled_or_forked_it_starts_empty() -> None:
    cache = BlockCache(4096, block_size=1024)
    cache.read("k", len(DATA), 0, 10, Fetcher())
    back = pickle.loads(pickle.dumps(cache))
    assert (back.held, back.stats, back.budget) == (0, CacheStats(), 4096)
    if not hasattr(os, "fork"):
        return
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what it sees, then leave without running pytest's teardown
        try:
            os.write(write_end, pickle.dumps((cache.held, cache.stats.loads)))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        assert pickle.loads(fh.read()) == (0, 0)
    os.waitpid(pid, 0)
    assert cache.held == 1024  # the parent's blocks stay the parent's
