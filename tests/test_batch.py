"""Batch-first reads: ``__getitems__`` reads a batch into its columns and ``pickleshard.collate``
hands them over as tensors. Oracles: ``pickle.load`` for the samples, and
``default_collate([ds[i] for i in indices])`` for the collated batch."""

from __future__ import annotations

import math
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, default_collate

import pickleshard
from pickleshard import PickleDataset, errors
from pickleshard.read.batch import ARRAYS, INTS, SampleBatch
from pickleshard.testing import assert_same

DTYPES = ["<f4", "<f8", "<i8", "<i4", "|u1", "|b1", "<f2", "<c8", "<u2", ">f4", ">i8"]


def assert_collated(got: Any, want: Any, where: str = "batch") -> None:
    """``got`` is ``want``: the same containers, tensors of the same dtype, shape and values
    (a NaN equal to a NaN in the same place)."""
    assert type(got) is type(want), f"{where}: {type(got)} != {type(want)}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype, where
        assert got.shape == want.shape, where
        assert torch.equal(got, want) or (
            got.is_floating_point()
            and torch.equal(got.isnan(), want.isnan())
            and torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
        ), where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            assert_collated(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_collated(g, w, f"{where}[{k}]")
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), where
    else:
        assert_same(got, want)


def check_batch(ds: PickleDataset, indices: list[int]) -> SampleBatch:
    """The batch of ``indices`` against both oracles; returned for more checks."""
    batch = ds.__getitems__(indices)
    assert isinstance(batch, SampleBatch)
    alone = [ds[i] for i in indices]
    for got, want in zip(batch, alone, strict=True):
        assert_same(got, want)
    try:
        want = default_collate(alone)
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:  # what torch cannot collate
        with pytest.raises(type(exc)):
            pickleshard.collate(batch)
        return batch
    assert_collated(pickleshard.collate(batch), want)
    assert_collated(default_collate(batch), want)  # DataLoader without our collate
    return batch


# -- files ----------------------------------------------------------------------------------


@st.composite
def fields(draw: st.DrawFn, n: int) -> list[Any]:
    """One field's values for ``n`` samples: arrays of one dtype and shape (sometimes with an
    odd one out), ints, floats, text, ragged arrays or small objects."""
    kind = draw(
        st.sampled_from(
            ["arrays", "arrays", "arrays", "ints", "floats", "text", "ragged", "objects"]
        )
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if kind == "arrays":
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = tuple(draw(st.lists(st.integers(1, 5), max_size=3)))
        values = [(rng.integers(0, 100, shape)).astype(dtype) for _ in range(n)]
        if draw(st.integers(0, 4)) == 0:  # one sample of another shape
            values[draw(st.integers(0, n - 1))] = np.zeros((*shape, 2), dtype)
        return values
    if kind == "ints":
        big = draw(st.booleans()) and draw(st.booleans())
        return [
            int(v) * (1 << 70 if big and k == 0 else 1)
            for k, v in enumerate(rng.integers(-50, 500, n))
        ]
    if kind == "floats":
        return [float(v) for v in rng.standard_normal(n)]
    if kind == "text":
        return [f"s{v}" for v in rng.integers(0, 1000, n)]
    if kind == "ragged":
        return [np.arange(int(k), dtype=np.int64) for k in rng.integers(1, 4, n)]
    return [{"a": int(v), "b": [1, 2]} for v in rng.integers(0, 9, n)]


@st.composite
def datasets(draw: st.DrawFn) -> dict[str, Any]:
    nfiles = draw(st.integers(1, 3))
    nf = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(["columns", "records"]))
    protocol = draw(st.sampled_from([2, 3, 4, 5]))
    files = []
    for _ in range(nfiles):
        n = draw(st.integers(2, 12))
        files.append([draw(fields(n)) for _ in range(nf)])
    # every file's field k: the same kind across files most of the time (a dataset's files
    # agree), different sometimes (the batch's column then holds a list)
    if draw(st.booleans()):
        for f in files[1:]:
            for k in range(nf):
                first = files[0][k][0]
                if (
                    isinstance(first, np.ndarray)
                    and isinstance(f[k][0], np.ndarray)
                    and first.dtype.kind != "c"
                ):
                    f[k] = [v.astype(files[0][k][0].dtype) for v in f[k]]
    return {"files": files, "layout": layout, "protocol": protocol}


def write(folder: Path, data: dict[str, Any]) -> list[Path]:
    paths = []
    for k, cols in enumerate(data["files"]):
        path = folder / f"part{k}.pkl"
        with open(path, "wb") as fh:
            if data["layout"] == "columns":
                pickle.dump(tuple(cols), fh, protocol=data["protocol"])
            else:
                for row in zip(*cols, strict=True):
                    pickle.dump(row, fh, protocol=data["protocol"])
        paths.append(path)
    return paths


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=datasets(), seed=st.integers(0, 2**16))
def test_batches_equal_pickle_load_and_default_collate(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any], seed: int
) -> None:
    folder = tmp_path_factory.mktemp("batch")
    paths = write(folder, data)
    layout = "records" if data["layout"] == "records" else "columns"
    ds = PickleDataset(folder, jobs=1, layout=layout)
    want = [s for p in paths for s in _loaded(p, layout)]
    assert len(ds) == len(want)
    rng = np.random.default_rng(seed)
    for size in (1, min(5, len(ds)), len(ds)):
        indices = rng.permutation(len(ds))[:size].tolist()
        batch = check_batch(ds, indices)
        for got, i in zip(batch, indices, strict=True):
            assert_same(got, tuple(want[i]))


def _loaded(path: Path, layout: str) -> list[tuple[Any, ...]]:
    """The samples of ``path`` by ``pickle.load`` alone."""
    objs = []
    with open(path, "rb") as fh:
        while fh.peek(1):
            objs.append(pickle.load(fh))
    if layout == "columns":
        return list(zip(*objs[0], strict=True))
    return [tuple(o) for o in objs]


# -- the common case: columns of arrays and ints ---------------------------------------------


def _seed_files(
    folder: Path, nfiles: int = 3, n: int = 40, shape: tuple[int, ...] = (3, 4, 4)
) -> None:
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for k in range(nfiles):
        xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
        ys = [int(v) for v in rng.integers(0, 10, n)]
        with open(folder / f"part{k}.pkl", "wb") as fh:
            pickle.dump((xs, ys), fh, protocol=4)


def test_arrays_and_ints_land_in_one_buffer_each(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d")
    indices = np.random.default_rng(1).permutation(len(ds))[:17].tolist()
    batch = check_batch(ds, indices)
    assert [c.kind for c in batch.columns] == [ARRAYS, INTS]
    assert batch.columns[0].data.shape == (17, 3, 4, 4)
    x, y = pickleshard.collate(batch)
    assert x.data_ptr() == batch.columns[0].data.ctypes.data  # the buffer is the tensor
    assert y.dtype == torch.int64


def test_whole_mode_batches_gather_into_the_same_columns(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d", mode="whole")
    batch = check_batch(ds, [5, 100, 3, 41, 5])
    assert [c.kind for c in batch.columns] == [ARRAYS, INTS]


def test_a_batch_mixing_span_and_whole_files(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d", nfiles=2)
    with open(tmp_path / "d" / "part9.pkl", "wb") as fh:  # protocol 0: read whole
        pickle.dump(([np.ones((3, 4, 4), np.float32)] * 3, [1, 2, 3]), fh, protocol=0)
    ds = PickleDataset(tmp_path / "d")
    assert "whole" in ds.file_modes
    assert "span" in ds.file_modes
    check_batch(ds, list(range(len(ds)))[::-1])


def test_transform_gives_a_list_that_default_collate_reads(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d", transform=lambda s: (s[0] * 2, s[1]))
    got = ds.__getitems__([3, 1])
    assert isinstance(got, list)
    assert_collated(pickleshard.collate(got), default_collate([ds[3], ds[1]]))


def test_negative_and_out_of_range_indices(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d", nfiles=1, n=5)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, [-1, 0, -5])
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, 5])
    assert len(ds.__getitems__([])) == 0


def test_neighbours_are_read_in_one_call_and_equal(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d", nfiles=1, n=200)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, list(range(50, 120)))  # consecutive spans: coalesced reads


def test_a_changed_framing_byte_is_a_file_changed_error(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d", nfiles=1, n=10)
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, [0, 1])
    path = tmp_path / "d" / "part0.pkl"
    start = int(ds.span_files.reader(0).scan.starts[4, 0])
    flip_byte_in_place(path, start)  # the framing byte of sample 4
    with pytest.raises(errors.FileChangedError) as info:
        ds.__getitems__([2, 4, 6])
    assert info.value.sample == 4


def flip_byte_in_place(path: Path, offset: int) -> None:
    """Invert the byte at ``offset`` of ``path``, its size and times kept: a change only the
    content checks can see."""
    st_ = os.stat(path)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns))


def test_a_file_cut_short_under_its_mapping_is_an_error_not_a_crash(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d", nfiles=1, n=200, shape=(64, 64))
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, [0, 1])  # the file is mapped now
    path = tmp_path / "d" / "part0.pkl"
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(errors.PickleshardError) as info:
        ds.__getitems__([150, 190])
    assert str(path) in str(info.value)


def test_samples_over_the_bound_are_refused_in_a_batch(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d", nfiles=1, n=10)
    ds = PickleDataset(tmp_path / "d", max_sample_bytes=100)
    with pytest.raises(errors.SampleTooLargeError):
        ds.__getitems__([1, 2])


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_with_collate_equals_default_collate(tmp_path: Path, workers: int) -> None:
    _seed_files(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d")
    order = np.random.default_rng(3).permutation(len(ds)).tolist()
    ours = DataLoader(
        ds, batch_size=16, sampler=order, collate_fn=pickleshard.collate, num_workers=workers
    )
    theirs = DataLoader(ds, batch_size=16, sampler=order, num_workers=workers)
    n = 0
    for got, want in zip(ours, theirs, strict=True):
        assert_collated(got, want)
        n += len(got[0])
    assert n == len(ds)


def test_worker_batches_are_allocated_in_shared_memory(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d")
    loader = DataLoader(ds, batch_size=8, collate_fn=pickleshard.collate, num_workers=1)
    x, _ = next(iter(loader))
    assert x.is_shared()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a GPU")
def test_pinned_batches(tmp_path: Path) -> None:
    from pickleshard.read.collate import batch_allocator

    _seed_files(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d")
    batch = ds._batches.read([1, 2, 3], batch_allocator(pin_memory=True))
    x, _ = pickleshard.collate(batch)
    assert x.is_pinned()


def test_dict_samples_collate_to_a_dict_as_default_collate_does(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    rng = np.random.default_rng(0)
    with open(tmp_path / "d" / "transitions.pkl", "wb") as fh:
        for k in range(30):
            obs = rng.standard_normal(8).astype(np.float32)
            pickle.dump({"obs": obs, "next_obs": obs + 1, "reward": k}, fh, protocol=4)
    ds = PickleDataset(tmp_path / "d")
    assert isinstance(ds[0], dict)
    batch = check_batch(ds, [7, 3, 29, 0])
    assert isinstance(batch[0], dict)
    assert list(pickleshard.collate(batch)) == ["obs", "next_obs", "reward"]


def test_a_file_of_ints_alone(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with open(tmp_path / "d" / "ints.pkl", "wb") as fh:
        pickle.dump(([1, 2, 3, 4], [5, 6, 7, 8]), fh, protocol=4)
    ds = PickleDataset(tmp_path / "d")
    batch = check_batch(ds, [3, 0, 2])
    assert [c.kind for c in batch.columns] == [INTS, INTS]


def test_a_cold_batch_asks_for_its_spans_first_and_reads_the_same(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, [4, 90, 13])
    ds._batches.cold = True  # as after a batch that came from the device
    check_batch(ds, [7, 100, 2, 41])


def test_closing_the_readers_lets_go_of_the_mappings(tmp_path: Path) -> None:
    _seed_files(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d")
    check_batch(ds, [4, 90, 13])
    fills = [f for f in ds._batches._fills if f is not None]
    assert fills
    assert all(f.mapped is not None for f in fills)
    ds.span_files.close()
    assert all(f.mapped is None for f in fills)
    check_batch(ds, [5, 91, 14])  # opened and mapped again


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_is_one_batch_that_collates_equal_to_default_collate(
    tmp_path: Path, workers: int
) -> None:
    _seed_files(tmp_path / "a", nfiles=2)
    _seed_files(tmp_path / "b", nfiles=1, n=30)
    mix = pickleshard.MixedDataset(
        [PickleDataset(tmp_path / "a"), PickleDataset(tmp_path / "b")], [0.5, 0.5], seed=3
    )
    indices = list(range(0, len(mix), 3))
    batch = mix.__getitems__(indices)
    alone = [mix[i] for i in indices]
    for got, want in zip(batch, alone, strict=True):
        assert_same(got, want)
    assert_collated(pickleshard.collate(batch), default_collate(alone))
    assert_collated(default_collate(batch), default_collate(alone))
    ours = DataLoader(mix, batch_size=16, collate_fn=pickleshard.collate, num_workers=workers)
    theirs = DataLoader(mix, batch_size=16, num_workers=workers)
    for got, want in zip(ours, theirs, strict=True):
        assert_collated(got, want)
