"""PickleDataset: indexing, batches, transform, the per-process cache, pickling, and a real DataLoader."""

from __future__ import annotations

import itertools
import os
import pickle
import re
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import BAD_FILES, LAYOUT_CASES, WritePickle, oracle_samples
from pickleshard import errors
from pickleshard.dataset import PickleDataset
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.samplers import BlockShuffleSampler
from pickleshard.testing import assert_same

FILES, PER_FILE = 5, 6


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    write_synthetic(tmp_path / "data", files=FILES, per_file=PER_FILE, shape=(4, 4))
    return tmp_path / "data"


@pytest.fixture
def expected(data_dir: Path) -> list[tuple[Any, ...]]:
    return [s for p in sorted(data_dir.glob("*.pkl")) for s in oracle_samples(p)]


def _file_nbytes(data_dir: Path) -> list[int]:
    """The decoded size the index records for each (equally shaped) file, in file order: equal
    but for the few bytes of values the samples share (a small int counts once per file)."""
    sizes = [f.decoded_nbytes for f in PickleDataset(data_dir).index.files]
    assert 3 * min(sizes) > 2.5 * max(sizes)  # so two files fit a budget where three do not
    return sizes


# -- indexing ------------------------------------------------------------------------------------


def test_len_fields_and_items(data_dir: Path, expected: list[tuple[Any, ...]]) -> None:
    ds = PickleDataset(data_dir)
    assert len(ds) == FILES * PER_FILE == len(expected)
    assert ds.fields == ("x", "y")
    for i in (0, 5, 6, len(ds) - 1):
        assert_same(ds[i], expected[i])
    assert "samples=30" in repr(ds)


def test_negative_indices_count_from_the_end(
    data_dir: Path, expected: list[tuple[Any, ...]]
) -> None:
    ds = PickleDataset(data_dir)
    assert_same(ds[-1], expected[-1])
    assert_same(ds[-len(ds)], expected[0])
    assert_same(ds[np.int64(-7)], expected[-7])


@pytest.mark.parametrize("bad", [30, 31, -31, 10**9])
def test_out_of_range_is_an_index_error(data_dir: Path, bad: int) -> None:
    ds = PickleDataset(data_dir)
    with pytest.raises(IndexError, match=f"{bad}.*30 samples"):
        ds[bad]
    with pytest.raises(IndexError):
        ds.__getitems__([0, bad])


def test_getitems_equals_getitem_in_request_order(
    data_dir: Path, expected: list[tuple[Any, ...]]
) -> None:
    ds = PickleDataset(data_dir)
    indices = [13, 0, 13, 29, -1, 6, 7, 0, 25, 12, 13]  # duplicates, several files, interleaved
    batch = ds.__getitems__(indices)
    assert len(batch) == len(indices)
    for got, i in zip(batch, indices, strict=True):
        assert_same(got, ds[i])
        assert_same(got, expected[i])
    assert ds.__getitems__([]) == []


def test_getitems_loads_each_file_of_a_batch_once(data_dir: Path) -> None:
    ds = PickleDataset(data_dir, cache_bytes=0, mode="whole")  # holds one file at a time
    ds.__getitems__([0, 12, 1, 13, 2, 24, 14, 3])  # files 0, 2, 0, 2, 0, 4, 2, 0
    assert (ds.cache_stats.loads, ds.cache_stats.misses) == (3, 3)


def test_transform_is_applied_to_every_sample(
    data_dir: Path, expected: list[tuple[Any, ...]]
) -> None:
    ds = PickleDataset(data_dir, transform=lambda s: (s[1], float(s[0].sum())))
    assert ds[3] == (expected[3][1], float(expected[3][0].sum()))
    assert ds.__getitems__([8, 3]) == [ds[8], ds[3]]


# -- the cache -----------------------------------------------------------------------------------


def test_cache_budget_is_enforced(data_dir: Path) -> None:
    sizes = _file_nbytes(data_dir)
    budget = 2 * max(sizes) + max(sizes) // 2  # room for two files
    ds = PickleDataset(data_dir, cache_bytes=budget, mode="whole")
    for i in range(len(ds)):
        ds[i]
        assert ds.cache_stats.bytes_used <= budget
    stats = ds.cache_stats
    assert (stats.misses, stats.loads, stats.evictions) == (FILES, FILES, FILES - 2)
    assert stats.hits == len(ds) - FILES
    assert stats.bytes_used == sizes[-2] + sizes[-1]  # read in order: the last two are held
    pairs = [a + b for a, b in itertools.pairwise(sizes)]
    assert stats.peak_bytes == max(pairs) <= budget
    assert len(ds.cache) == 2


def test_a_budget_below_one_file_still_holds_one(data_dir: Path) -> None:
    sizes = _file_nbytes(data_dir)
    ds = PickleDataset(data_dir, cache_bytes=min(sizes) // 3, mode="whole")
    for i in range(len(ds)):
        ds[i]
    assert ds.cache_stats.peak_bytes == max(sizes)
    assert ds.cache_stats.loads == FILES
    assert len(ds.cache) == 1


def test_cache_evicts_the_least_recently_used_file(data_dir: Path) -> None:
    sizes = _file_nbytes(data_dir)
    ds = PickleDataset(data_dir, cache_bytes=2 * max(sizes), mode="whole")  # two files, not three
    first = [f * PER_FILE for f in range(FILES)]  # sample 0 of each file
    for f in (0, 1, 0, 2):  # file 2 needs room: file 1 is the least recently used
        ds[first[f]]
    assert ds.cache_stats.loads == 3
    ds[first[0]]
    assert ds.cache_stats.loads == 3
    ds[first[1]]
    assert ds.cache_stats.loads == 4
    assert ds.cache_stats.evictions == 2


def test_negative_cache_budget_is_refused(data_dir: Path) -> None:
    with pytest.raises(ValueError, match="cache_bytes"):
        PickleDataset(data_dir, cache_bytes=-1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_starts_with_an_empty_cache(data_dir: Path) -> None:
    ds = PickleDataset(data_dir, mode="whole")
    ds[0]
    ds[PER_FILE]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report, then leave without running pytest's teardown
        try:
            before = (len(ds.cache), ds.cache_stats.loads, ds.cache_stats.bytes_used)
            ds[1]
            after = (ds.cache_stats.loads, ds.cache_stats.hits)
            os.write(write_end, pickle.dumps((before, after)))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        before, after = pickle.loads(fh.read())
    os.waitpid(pid, 0)
    assert before == (0, 0, 0)
    assert after == (1, 0)  # loaded file 0 again rather than using the parent's copy
    assert (ds.cache_stats.loads, len(ds.cache)) == (2, 2)  # the parent's cache is untouched


def test_pickling_leaves_the_cache_behind_and_reopens_the_index(data_dir: Path) -> None:
    ds = PickleDataset(data_dir, mode="whole")
    for i in range(len(ds)):
        ds[i]
    assert ds.cache_stats.bytes_used > 0
    data = pickle.dumps(ds)
    assert len(data) < 4096  # all five decoded files stay behind
    back = pickle.loads(data)
    assert back.index is not ds.index
    assert isinstance(back.index.samples, np.memmap)
    assert (back.cache_stats.loads, len(back.cache)) == (0, 0)
    assert ds.cache_stats.loads == FILES  # pickling did not disturb the original
    for i in (0, 17, -1):
        assert_same(back[i], ds[i])
    shutil.rmtree(data_dir / ".pickleshard")
    with pytest.raises(errors.IndexFormatError):  # unpickling reads the index from disk
        pickle.loads(data)


# -- bad inputs -----------------------------------------------------------------------------------


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(errors.DatasetNotFoundError, match=re.escape(str(tmp_path / "nope"))):
        PickleDataset(tmp_path / "nope")


def test_directory_without_pickle_files(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(errors.NoPickleFilesError, match=re.escape(str(tmp_path / "empty"))):
        PickleDataset(tmp_path / "empty")


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_bad_file_is_refused_at_construction(tmp_path: Path, data: bytes, expected: str) -> None:
    write_synthetic(tmp_path / "data", files=1, per_file=2, shape=(2,))
    bad = tmp_path / "data" / "bad.pkl"
    bad.write_bytes(data)
    with pytest.raises(getattr(errors, expected)) as info:
        PickleDataset(tmp_path / "data", jobs=1)
    assert str(bad.resolve()) in str(info.value)


_OBJECT_CASES = {
    **LAYOUT_CASES,
    "length_mismatch": (([1, 2, 3], [4, 5]), "FieldLengthMismatchError"),
}


@pytest.mark.parametrize(("obj", "expected"), _OBJECT_CASES.values(), ids=_OBJECT_CASES)
def test_unsupported_layout_is_refused_at_construction(
    write_pickle: WritePickle, obj: Any, expected: str
) -> None:
    bad = write_pickle("bad.pkl", obj)
    with pytest.raises(getattr(errors, expected)) as info:
        PickleDataset(bad.parent)
    assert str(bad.resolve()) in str(info.value)
    if expected == "FieldLengthMismatchError":
        assert "= 3" in str(info.value)
        assert "= 2" in str(info.value)


def test_unreadable_file_is_refused_at_construction(
    tmp_path: Path, unreadable_dir_pkl: Path
) -> None:
    good = write_synthetic(tmp_path / "good", files=1, per_file=2, shape=(2,))[0]
    with pytest.raises(errors.UnreadableFileError) as info:
        PickleDataset([good, unreadable_dir_pkl])
    assert str(unreadable_dir_pkl.resolve()) in str(info.value)


@pytest.mark.parametrize("mode", ["auto", "whole"])
def test_file_damaged_after_opening_fails_on_read_naming_it(data_dir: Path, mode: str) -> None:
    ds = PickleDataset(data_dir, mode=mode)  # type: ignore[arg-type]
    victim = data_dir / "part-00001.pkl"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    assert_same(ds[0], oracle_samples(data_dir / "part-00000.pkl")[0])
    # both modes compare the file with its index row: cut short since, it is a changed file
    # (auto: this dataset's files are span-indexed)
    with pytest.raises(errors.FileChangedError, match=r"it is \d+ bytes, \d+ when indexed") as info:
        ds[PER_FILE]
    assert str(victim.resolve()) in str(info.value)
    with pytest.raises(errors.StaleIndexError, match=r"part-00001\.pkl"):
        PickleDataset(data_dir)


# -- a real DataLoader ---------------------------------------------------------------------------


class TracedDataset(PickleDataset):
    """Returns, with each sample, the worker's pid and its cache's load count after the batch."""

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        samples = super().__getitems__(indices)
        loads = self.cache_stats.loads
        return [(int(i), s[1], os.getpid(), loads) for i, s in zip(indices, samples, strict=True)]


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


def test_dataloader_epoch_sees_every_sample_once_and_loads_each_file_once_per_worker(
    tmp_path: Path,
) -> None:
    write_synthetic(tmp_path / "data", files=8, per_file=9, shape=(3,), seed=4)
    probe = PickleDataset(tmp_path / "data")
    nbytes = max(f.decoded_nbytes for f in probe.index.files)
    labels = [s[1] for p in sorted((tmp_path / "data").glob("*.pkl")) for s in oracle_samples(p)]
    workers, batch_size = 2, 4
    ds = TracedDataset(
        tmp_path / "data", cache_bytes=workers * 2 * nbytes, mode="whole"
    )  # 2 files per worker
    sampler = BlockShuffleSampler(ds, batch_size=batch_size, num_workers=workers, seed=11)
    loader = DataLoader(
        ds, sampler=sampler, batch_size=batch_size, num_workers=workers, collate_fn=_as_list
    )
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen: list[int] = []
        files_by_pid: dict[int, set[int]] = defaultdict(set)
        loads_by_pid: dict[int, int] = defaultdict(int)
        for batch in loader:
            assert len(batch) <= batch_size
            for i, label, pid, loads in batch:
                assert label == labels[i]
                seen.append(i)
                files_by_pid[pid].add(ds.index.locate(i)[0])
                loads_by_pid[pid] = max(loads_by_pid[pid], loads)
        assert sorted(seen) == list(range(len(ds)))
        assert len(files_by_pid) == workers
        assert os.getpid() not in files_by_pid
        # Every file a worker touched was loaded, so equality means: once each.
        assert loads_by_pid == {pid: len(files) for pid, files in files_by_pid.items()}
        orders.append(seen)
    assert orders[0] != orders[1]


def test_dataloader_with_spawned_worker(data_dir: Path, expected: list[tuple[Any, ...]]) -> None:
    ds = PickleDataset(data_dir)
    ds[0]  # a warm cache in the parent must not travel
    loader = DataLoader(ds, batch_size=7, num_workers=1, multiprocessing_context="spawn")
    xs, ys = [], []
    for x, y in loader:
        xs.append(x)
        ys.append(y)
    assert torch.equal(torch.cat(ys), torch.tensor([s[1] for s in expected]))
    assert torch.equal(torch.cat(xs), torch.from_numpy(np.stack([s[0] for s in expected])))
