"""The whole-file cache: one CacheBudget (share per worker, decoded size), the LRU cache keeps it."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from pickleshard import errors
from pickleshard.read.whole.cache import CacheBudget, WholeFileCache, estimate_nbytes
from pickleshard.read.whole.load import load_layout
from pickleshard.scan.layouts import DecodedLayout


def test_estimate_nbytes_counts_array_data_and_extrapolates_long_lists() -> None:
    arr = np.zeros(1000, dtype=np.float64)
    assert estimate_nbytes(arr) >= 8000
    column = [np.zeros(1000, dtype=np.float64) for _ in range(500)]  # more than the 64 sampled
    assert 500 * 8000 <= estimate_nbytes(column) <= 500 * 8000 * 1.2
    assert estimate_nbytes((column, list(range(500)))) > estimate_nbytes(column)


def test_estimate_nbytes_counts_a_shared_object_once() -> None:
    big = np.zeros(1000, dtype=np.float64)
    assert estimate_nbytes([big, big]) < 1.2 * estimate_nbytes([big])
    # a pickle's memo makes a list of 64 references to one list, per level: 407 bytes of
    # pickle for three levels. Walking every path (64**3 visits, 26 MB "estimated" for a few
    # KB of objects; at six levels, 64**6 visits: a hang) is what counting once rules out.
    nested: list[object] = [0]
    for _ in range(3):
        nested = [nested] * 64
    assert len(pickle.dumps(nested, protocol=4)) < 500
    assert estimate_nbytes(pickle.loads(pickle.dumps(nested, protocol=4))) < 4096


class _FakeFiles:
    """A loader over named fake files of given sizes that records each load."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.loaded: list[str] = []

    def __call__(self, path: str) -> DecodedLayout:
        self.loaded.append(path)
        return DecodedLayout("columns", ("x",), ([path],))


def test_cache_counts_hits_misses_loads() -> None:
    files = _FakeFiles({"a": 10, "b": 10})
    cache = WholeFileCache(100, files)
    cache.get("a", 10)
    cache.get("a", 10)
    cache.get("b", 10)
    stats = cache.stats
    assert (stats.hits, stats.misses, stats.loads, stats.evictions) == (1, 2, 2, 0)
    assert stats.bytes_used == stats.peak_bytes == 20
    assert files.loaded == ["a", "b"]
    assert cache.get("a", 10).columns == (["a"],)


def test_cache_evicts_least_recently_used_first() -> None:
    files = _FakeFiles({})
    cache = WholeFileCache(25, files)
    for name in ("a", "b", "a", "c"):  # c needs room: b is the least recently used
        cache.get(name, 10)
    assert files.loaded == ["a", "b", "c"]
    cache.get("a", 10)
    assert files.loaded == ["a", "b", "c"]
    cache.get("b", 10)
    assert files.loaded == ["a", "b", "c", "b"]
    assert cache.stats.evictions == 2
    assert len(cache) == 2


def test_cache_keeps_its_budget_even_while_loading() -> None:
    sizes = [7, 3, 12, 5, 9, 1, 11, 4, 8, 2] * 3
    cache = WholeFileCache(20, _FakeFiles({}))
    for k, size in enumerate(sizes):
        cache.get(f"f{k % 13}", size)
        assert cache.stats.bytes_used <= 20
    assert cache.stats.peak_bytes <= 20
    assert cache.stats.evictions > 0


def test_cache_holds_a_file_larger_than_the_budget_alone() -> None:
    cache = WholeFileCache(10, _FakeFiles({}))
    cache.get("small", 4)
    cache.get("huge", 50)
    assert len(cache) == 1
    assert cache.stats.bytes_used == cache.stats.peak_bytes == 50
    cache.get("small", 4)
    assert len(cache) == 1
    assert cache.stats.bytes_used == 4


def test_cache_without_expected_size_uses_the_estimate() -> None:
    cache = WholeFileCache(1 << 20, lambda p: DecodedLayout("columns", ("x",), ([np.zeros(100)],)))
    cache.get("a")
    assert cache.stats.bytes_used >= 800


def test_cache_does_not_keep_failed_loads(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(b"")
    cache = WholeFileCache(1 << 20, load_layout)
    for _ in range(2):
        with pytest.raises(errors.EmptyPickleError):
            cache.get(str(bad))
    assert (cache.stats.misses, cache.stats.loads, len(cache)) == (2, 0, 0)


def test_cache_clear_and_bad_budget() -> None:
    cache = WholeFileCache(100, _FakeFiles({}))
    cache.get("a", 10)
    cache.clear()
    assert (len(cache), cache.stats.bytes_used) == (0, 0)
    with pytest.raises(ValueError, match="max_bytes"):
        WholeFileCache(-1, _FakeFiles({}))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_cache_in_a_forked_child_starts_empty() -> None:
    files = _FakeFiles({})
    cache = WholeFileCache(100, files)
    cache.get("a", 10)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what it sees, then leave without running pytest's teardown
        try:
            cache.get("a", 10)
            stats = cache.stats
            report = (stats.hits, stats.misses, stats.loads, stats.bytes_used, len(cache))
            os.write(write_end, pickle.dumps((report, files.loaded)))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        report, loaded = pickle.loads(fh.read())
    os.waitpid(pid, 0)
    # The child missed and loaded "a" itself instead of using the parent's decoded copy, and its
    # counters started from zero.
    assert report == (0, 1, 1, 10, 1)
    assert loaded == ["a", "a"]
    assert (cache.stats.hits, cache.stats.loads, files.loaded) == (0, 1, ["a"])


@pytest.mark.parametrize(
    ("total", "workers", "share"), [(100, 0, 100), (100, 1, 100), (100, 3, 33), (5, 8, 0)]
)
def test_budget_shares_its_total_among_workers(total: int, workers: int, share: int) -> None:
    budget = CacheBudget(total)
    assert budget.share(workers) == share
    assert budget.share_here() == total  # not inside a DataLoader worker


def test_budget_refuses_a_negative_total() -> None:
    with pytest.raises(ValueError, match="cache_bytes must be >= 0"):
        CacheBudget(-1)


def test_budget_sizes_a_file_by_its_recorded_size_else_the_estimate() -> None:
    decoded = DecodedLayout("columns", ("x",), ([np.zeros(100)],))
    assert CacheBudget.size_of(decoded, 7) == 7
    assert CacheBudget.size_of(decoded) == estimate_nbytes(decoded.columns) >= 800


def test_dataset_and_block_sampler_share_one_budget(tmp_path: Path) -> None:
    from pickleshard import BlockShuffleSampler, PickleDataset

    for f in range(3):
        with open(tmp_path / f"part-{f}.pkl", "wb") as fh:
            pickle.dump(([np.zeros(4, np.float32)] * 5, list(range(5))), fh)
    ds = PickleDataset(tmp_path, mode="whole", cache_bytes=900)
    sampler = BlockShuffleSampler(ds, num_workers=3)
    assert ds.budget == sampler.budget == CacheBudget(900)
    assert ds.cache.max_bytes == ds.budget.share_here() == 900
    ds[0]
    ds.cache_bytes = 0  # replaces the budget, and the cache made with the old one
    assert ds.budget == CacheBudget(0)
    assert ds.cache.max_bytes == 0
    assert ds.cache.stats.loads == 0
    with pytest.raises(ValueError, match="cache_bytes must be >= 0"):
        PickleDataset(tmp_path, mode="whole", cache_bytes=-5)
