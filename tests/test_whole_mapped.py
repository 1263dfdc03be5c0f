"""Whole files shared with DataLoader workers: decoded once into a mapped cache entry
(:mod:`pickleshard.read.whole.mapped`). The oracle is ``pickle.load``."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import PickleDataset, errors
from pickleshard.io.identity import FileIdentity
from pickleshard.read.whole import mapped as wholemap
from pickleshard.read.whole.mapped import (
    MappedInts,
    MappedPickled,
    MappedRows,
    open_entry,
    write_entry,
)
from pickleshard.safety.policy import DEFAULT_POLICY
from pickleshard.scan.layouts import DecodedLayout
from pickleshard.testing import assert_same


def _cifar_like(path: Path, rows: int, seed: int = 0) -> dict[bytes, Any]:
    rng = np.random.default_rng(seed)
    obj = {
        b"data": rng.integers(0, 256, size=(rows, 48), dtype=np.uint8),
        b"labels": [int(v) for v in rng.integers(0, 10, size=rows)],
    }
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)
    return obj


_IDENT = FileIdentity(1, 2, 3, 4)


def test_entry_round_trips_every_column_kind(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 6
    columns = (
        rng.standard_normal((n, 3, 2)).astype(np.float32),  # array
        [rng.integers(0, 9, size=(4,), dtype=np.int16) for _ in range(n)],  # stacked
        [int(v) for v in range(-3, n - 3)],  # ints
        [2**70, 1, 2, 3, 4, 5],  # an int beyond int64: pickled
        [True, False, True, True, False, False],  # bools are not ints here: pickled
        [{"name": f"s{k}", "t": (k, None)} for k in range(n)],  # Python objects: pickled
        [rng.standard_normal(k + 1) for k in range(n)],  # ragged arrays: pickled
        np.arange(n, dtype=np.int64),  # a 1-D array column: numpy scalars
    )
    decoded = DecodedLayout("columns", tuple(f"f{k}" for k in range(len(columns))), columns)
    entry = tmp_path / "e"
    write_entry(entry, decoded, _IDENT)
    got = open_entry(entry, DEFAULT_POLICY, "data.pkl")
    assert got.identity == _IDENT
    assert got.layout.fields == decoded.fields
    assert got.layout.num_samples == n
    kinds = [type(c) for c in got.layout.columns]
    assert kinds == [MappedRows, MappedRows, MappedInts, *[MappedPickled] * 4, MappedRows]
    for col, want in zip(got.layout.columns, columns, strict=True):
        for i in range(n):
            assert_same(col[i], want[i])


def test_mapped_columns_are_read_only_maps_and_samples_private_copies(tmp_path: Path) -> None:
    data = np.arange(40, dtype=np.uint8).reshape(10, 4)
    entry = tmp_path / "e"
    write_entry(entry, DecodedLayout("columns", ("x",), (data,)), _IDENT)
    col = open_entry(entry, DEFAULT_POLICY, "data.pkl").layout.columns[0]
    assert isinstance(col, MappedRows)
    assert not col.array.flags.writeable
    assert isinstance(col.array.base, np.memmap)  # pages of the entry's file, shared
    row = col[3]
    assert row.flags.writeable
    assert row.base is None
    row[:] = 0
    assert np.array_equal(col[3], data[3])


def test_corrupt_entry_is_an_index_format_error(tmp_path: Path) -> None:
    entry = tmp_path / "e"
    write_entry(entry, DecodedLayout("columns", ("x",), (["a", "bc", "def"],)), _IDENT)
    np.save(entry / "c0.offsets.npy", np.array([0, 5, 2, 99], dtype=np.int64))
    with pytest.raises(errors.IndexFormatError, match="offsets"):
        open_entry(entry, DEFAULT_POLICY, "data.pkl")
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, "kinds": ["nope"]}))
    with pytest.raises(errors.IndexFormatError, match="unknown kind"):
        open_entry(entry, DEFAULT_POLICY, "data.pkl")


@pytest.fixture
def as_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process reads whole files as a DataLoader worker does (through mapped entries)."""
    monkeypatch.setattr(wholemap, "in_worker", lambda: True)


def _entries(ds: PickleDataset) -> list[Path]:
    return sorted(p for p in (ds.index.path / "whole").iterdir() if p.is_dir())


@pytest.mark.usefixtures("as_worker")
def test_worker_reads_whole_files_from_one_mapped_entry(tmp_path: Path) -> None:
    obj = _cifar_like(tmp_path / "batch.pkl", 50)
    ds = PickleDataset(tmp_path, mode="whole")
    for i in range(len(ds)):
        x, y = ds[i].values()  # a dict of columns: samples are dicts
        assert_same(x, obj[b"data"][i])
        assert_same(y, obj[b"labels"][i])
    batch = ds.__getitems__([7, 3, 49])
    for got, i in zip(batch, [7, 3, 49], strict=True):
        assert_same(got["data"], obj[b"data"][i])
    (entry,) = _entries(ds)
    columns = ds.cache.get(ds._paths[0]).columns
    assert isinstance(columns[0], MappedRows)
    assert isinstance(columns[0].array.base, np.memmap)
    assert isinstance(columns[1], MappedInts)
    # another process (a fresh cache) maps the same entry instead of decoding again
    ds.cache.clear()
    ds[0]
    assert _entries(ds) == [entry]


@pytest.mark.usefixtures("as_worker")
def test_main_process_keeps_its_own_in_memory_cache(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(wholemap, "in_worker", lambda: False)
    _cifar_like(tmp_path / "batch.pkl", 20)
    ds = PickleDataset(tmp_path, mode="whole")
    ds[0]
    assert not (ds.index.path / "whole").exists()
    assert isinstance(ds.cache.get(ds._paths[0]).columns[0], np.ndarray)


@pytest.mark.usefixtures("as_worker")
def test_cache_bytes_bounds_what_a_worker_maps(tmp_path: Path) -> None:
    objs = [_cifar_like(tmp_path / f"b{k}.pkl", 40, seed=k) for k in range(4)]
    ds = PickleDataset(tmp_path, mode="whole")
    largest = max(f.decoded_nbytes for f in ds.index.files)
    ds.cache_bytes = 2 * largest
    for i in range(len(ds)):
        assert_same(ds[i]["data"], objs[i // 40][b"data"][i % 40])
        assert ds.cache_stats.bytes_used <= 2 * largest
        assert len(ds.cache) <= 2
    assert ds.cache_stats.evictions >= 2
    assert len(_entries(ds)) == 4  # each decoded once, on disk; only the budget's worth mapped


@pytest.mark.usefixtures("as_worker")
def test_file_changed_after_its_entry_was_written_is_detected(tmp_path: Path) -> None:
    _cifar_like(tmp_path / "batch.pkl", 30)
    ds = PickleDataset(tmp_path, mode="whole")
    ds[0]
    (entry,) = _entries(ds)
    _cifar_like(tmp_path / "batch.pkl", 30, seed=9)  # same size, other bytes
    ds.cache.clear()  # the next process (or epoch of a fresh worker) starts using the file
    with pytest.raises(errors.FileChangedError, match=r"batch\.pkl"):
        ds[0]
    assert _entries(ds) == [entry]  # the stale entry was not served, nor replaced


@pytest.mark.usefixtures("as_worker")
def test_entry_of_another_identity_is_refused(tmp_path: Path) -> None:
    _cifar_like(tmp_path / "batch.pkl", 30)
    ds = PickleDataset(tmp_path, mode="whole")
    ds[0]
    (entry,) = _entries(ds)
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, "identity": [1, 2, 3, 4]}))
    ds.cache.clear()
    with pytest.raises(errors.IndexFormatError, match="written for"):
        ds[0]


@pytest.mark.slow
def test_two_workers_share_one_decode_and_read_pickle_load_data(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    obj = _cifar_like(tmp_path / "batch.pkl", 64)
    ds = PickleDataset(tmp_path, mode="whole", cache_bytes=1024)
    loader = DataLoader(ds, batch_size=8, num_workers=2, shuffle=False)
    batches = list(loader)  # dicts of batched fields: the producer wrote a dict
    xs, ys = [b["data"] for b in batches], [b["labels"] for b in batches]
    assert np.array_equal(torch.cat(xs).numpy(), obj[b"data"])
    assert torch.cat(ys).tolist() == obj[b"labels"]
    (entry,) = _entries(ds)  # one entry: one decode, however many workers
    assert json.loads((entry / "meta.json").read_text())["kinds"] == ["array", "ints"]
    # no temporary directory left behind
    assert set(os.listdir(ds.index.path / "whole")) == {entry.name, entry.name[:16] + ".lock"}


@pytest.mark.usefixtures("as_worker")
def test_a_file_that_cannot_be_pickled_again_is_read_unshared(tmp_path: Path) -> None:
    # ([deep, [1]], [0, 1]), deep = [[[...]]] 5000 lists down: past the pickler's recursion
    # limit (pickle.dump cannot write it either), within the unpickler's (it has none)
    deep = b"]" * 5001 + b"a" * 5000
    x = b"](" + deep + b"]K\x01ae"
    (tmp_path / "deep.pkl").write_bytes(b"\x80\x04" + x + b"](K\x00K\x01e\x86.")
    ds = PickleDataset(tmp_path, mode="whole", max_depth=None, max_sample_bytes=None)
    with pytest.warns(RuntimeWarning, match="not shared"):
        assert ds[1] == ([1], 1)
    got, depth = ds[0][0], 0
    while got:
        got, depth = got[0], depth + 1
    assert depth == 5000
    assert _entries(ds) == []  # no entry, no temporary directory left


@pytest.mark.usefixtures("as_worker")
def test_no_room_for_the_cache_reads_unshared_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = _cifar_like(tmp_path / "batch.pkl", 20)
    ds = PickleDataset(tmp_path, mode="whole")

    def full(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wholemap, "write_entry", full)
    with pytest.warns(RuntimeWarning, match="No space left"):
        assert_same(ds[5]["data"], obj[b"data"][5])
    assert _entries(ds) == []


@pytest.mark.usefixtures("as_worker")
def test_cache_directory_that_cannot_be_made_reads_unshared(tmp_path: Path) -> None:
    obj = _cifar_like(tmp_path / "batch.pkl", 20)
    ds = PickleDataset(tmp_path, mode="whole")
    (ds.index.path / "whole").write_bytes(b"")  # a file where the directory should be
    with pytest.warns(RuntimeWarning, match="cannot write the whole-file cache"):
        assert_same(ds[5]["data"], obj[b"data"][5])
