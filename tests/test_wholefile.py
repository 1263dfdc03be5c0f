"""Whole-file loading: every bad file gets its own error naming it; the LRU cache keeps its budget."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import (
    BAD_FILES,
    LAYOUT_CASES,
    WritePickle,
    assert_deep_equal,
    outcome_without_privileges,
)
from pickleshard import errors
from pickleshard.scan.layouts import DecodedLayout
from pickleshard.wholefile import WholeFileCache, estimate_nbytes, load_file, load_layout


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_load_file_classifies_bad_bytes(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "bad.pkl"
    path.write_bytes(data)
    with pytest.raises(getattr(errors, expected)) as info:
        load_file(path)
    assert str(path) in str(info.value)
    assert info.value.path == str(path)


@pytest.mark.parametrize(("obj", "expected"), LAYOUT_CASES.values(), ids=LAYOUT_CASES)
def test_load_layout_rejects_unsupported_top_level(
    write_pickle: WritePickle, obj: object, expected: str
) -> None:
    path = write_pickle("odd.pkl", obj)
    assert_deep_equal(load_file(path), obj)  # it is a fine pickle ...
    with pytest.raises(getattr(errors, expected)) as info:
        load_layout(path)  # ... of no layout we can index
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "obj",
    [([1, 2, 3], [1, 2]), {"x": [1, 2, 3], "y": [0, 1]}, (np.zeros((3, 2)), [0, 1])],
    ids=["tuple", "dict", "ndarray"],
)
def test_load_layout_reports_both_lengths(write_pickle: WritePickle, obj: object) -> None:
    path = write_pickle("mismatch.pkl", obj)
    with pytest.raises(errors.FieldLengthMismatchError) as info:
        load_layout(path)
    message = str(info.value)
    assert str(path) in message
    assert "= 3" in message
    assert "= 2" in message


def test_load_file_of_a_directory_is_unreadable(unreadable_dir_pkl: Path) -> None:
    with pytest.raises(errors.UnreadableFileError) as info:
        load_file(unreadable_dir_pkl)
    assert str(unreadable_dir_pkl) in str(info.value)
    assert isinstance(info.value, OSError)


def test_load_file_of_a_missing_path_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "gone.pkl"
    with pytest.raises(errors.UnreadableFileError, match=re.escape(str(path))):
        load_file(path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="drops privileges in a forked child")
def test_load_file_without_permission_is_unreadable(locked_file: Path) -> None:
    err = outcome_without_privileges(lambda: load_file(locked_file))
    assert isinstance(err, errors.UnreadableFileError)
    assert str(locked_file) in str(err)
    assert "Permission denied" in str(err)
    assert outcome_without_privileges(lambda: load_file(locked_file.with_name("a.pkl"))) is None


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_load_file_equals_pickle_load(write_pickle: WritePickle, protocol: int) -> None:
    obj = ([np.arange(4, dtype=np.int16) * i for i in range(5)], ["a", "b", "c", "d", "e"])
    path = write_pickle(f"p{protocol}.pkl", obj, protocol=protocol)
    with open(path, "rb") as fh:
        assert_deep_equal(load_file(path), pickle.load(fh))
    decoded = load_layout(path)
    assert (decoded.layout, decoded.fields, decoded.num_samples) == ("columns", ("x", "y"), 5)


def test_estimate_nbytes_counts_array_data_and_extrapolates_long_lists() -> None:
    arr = np.zeros(1000, dtype=np.float64)
    assert estimate_nbytes(arr) >= 8000
    column = [np.zeros(1000, dtype=np.float64) for _ in range(500)]  # more than the 64 sampled
    assert 500 * 8000 <= estimate_nbytes(column) <= 500 * 8000 * 1.2
    assert estimate_nbytes((column, list(range(500)))) > estimate_nbytes(column)


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


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize(
    "objs",
    [
        [([1, 2], ["a", "b"]), ([3], ["c"])],  # chunks of one layout
        [([1, 2], ["a", "b"]), [(3, "c")]],  # chunks of two layouts, same fields
        [(1, "a"), (2, "b"), (3, "c")],  # one sample per pickle
        [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}],  # one dict sample per pickle
        [5, "x", None],  # single-field samples
        [(np.zeros((2, 3)), [0, 1]), (np.ones((1, 3)), [2])],  # array fields concatenate
    ],
    ids=["chunks", "mixed_chunks", "tuples", "dicts", "objects", "arrays"],
)
def test_load_layout_reads_every_appended_pickle(
    tmp_path: Path, objs: list[Any], protocol: int
) -> None:
    from picklegen import oracle

    path = tmp_path / "appended.pkl"
    with open(path, "wb") as fh:
        for obj in objs:
            pickle.dump(obj, fh, protocol=protocol)
    fields, want = oracle(path)
    decoded = load_layout(path)
    assert decoded.fields == fields
    assert decoded.layout.startswith("appended_")
    assert decoded.num_samples == len(want)
    for i, sample in enumerate(want):
        assert_deep_equal(tuple(col[i] for col in decoded.columns), sample)
    assert_deep_equal(load_file(path), objs[0])  # load_file: the first pickle only


def test_appended_samples_of_different_shapes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd.pkl"
    with open(path, "wb") as fh:
        for obj in [(1, 2), (3,)]:
            pickle.dump(obj, fh)
    with pytest.raises(errors.UnsupportedLayoutError, match="different shapes"):
        load_layout(path)
    with open(path, "ab") as fh:
        fh.write(b"trailing junk")
    with pytest.raises(errors.NotAPickleError, match="after pickle ending at"):
        load_layout(path)
