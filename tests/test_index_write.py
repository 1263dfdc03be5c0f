"""Writing an index's arrays by plain writes: the ``.npy`` files ``np.load`` reads back, the
checksums the header records, durability before the header names them, the old index intact
when a write fails."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import build_index
from pickleshard.index.arrays import file_checksum
from pickleshard.index.ondisk import SAMPLES_DTYPE
from pickleshard.indexing import write as write_module


def _data(folder: Path, files: int = 3, n: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        xs = [np.full(4, f * 100 + i, np.float32) for i in range(n + f)]
        (folder / f"p{f}.pkl").write_bytes(pickle.dumps((xs, list(range(n + f))), protocol=4))
    return folder


@pytest.mark.parametrize(
    ("dtype", "tail", "parts"),
    [
        (np.int64, (2,), [np.arange(6).reshape(3, 2), np.zeros((0, 2)), np.ones((4, 2))]),
        (np.int64, (), [np.arange(5)]),
        (np.int64, (3,), []),
        (SAMPLES_DTYPE, (), [np.array([(1, 2), (3, 4)], SAMPLES_DTYPE)]),
    ],
)
def test_concatenated_arrays_load_back_with_their_checksum(
    tmp_path: Path, dtype: Any, tail: tuple[int, ...], parts: list[np.ndarray]
) -> None:
    path = tmp_path / "a.npy"
    total = sum(len(p) for p in parts)
    crc, fd, offset = write_module._save_concatenated(path, iter(parts), total, dtype, tail)
    os.close(fd)
    got = np.load(path)
    assert np.load(path, mmap_mode="r").offset == offset  # where the index's map starts
    want = np.concatenate(parts).astype(dtype) if parts else np.empty((0, *tail), dtype)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == (total, *tail)
    np.testing.assert_array_equal(got, want)
    assert crc == file_checksum(path)


def test_parts_that_do_not_add_up_are_refused(tmp_path: Path) -> None:
    for parts, total in (([np.arange(3)], 5), ([np.arange(3), np.arange(3)], 4)):
        with pytest.raises(ValueError, match=r"rows|part"):
            write_module._save_concatenated(
                tmp_path / f"x{total}.npy", iter(parts), total, np.int64
            )
    with pytest.raises(ValueError, match="part of shape"):
        write_module._save_concatenated(
            tmp_path / "t.npy", iter([np.zeros((2, 3))]), 2, np.int64, (2,)
        )


def test_arrays_are_synced_before_the_header_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + Path(os.readlink(f"/proc/self/fd/{fd}")).name.split("-")[0])
        real_fsync(fd)

    def replace(a: Any, b: Any) -> None:
        events.append("replace " + Path(b).name)
        real_replace(a, b)

    monkeypatch.setattr(write_module.os, "fsync", fsync)
    monkeypatch.setattr(write_module.os, "replace", replace)
    idx = build_index(_data(tmp_path / "d"), jobs=1)
    # the audit's cache (audit.json, written by the build too) is no part of the index
    events = [e for e in events if not e.endswith("audit.json") and e != "fsync audit.json"]
    assert events[-1] == "replace index.json"
    synced = sorted(e.split()[1] for e in events[:-1])
    header = json.loads((tmp_path / "d" / ".pickleshard" / "index.json").read_text())
    assert synced == sorted(header["arrays"])
    assert idx.num_samples == 5 + 6 + 7


def test_a_failed_write_leaves_the_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _data(tmp_path / "d")
    build_index(folder, jobs=1)
    where = folder / ".pickleshard"
    before = sorted(p.name for p in where.iterdir())
    header = (where / "index.json").read_bytes()
    (folder / "p3.pkl").write_bytes((folder / "p0.pkl").read_bytes())
    calls = 0
    real = write_module._write

    def failing(fd: int, data: bytes, crc: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 6:  # the third array's data
            raise OSError(28, "No space left on device")
        return real(fd, data, crc)

    monkeypatch.setattr(write_module, "_write", failing)
    with pytest.raises(OSError, match="No space"):
        build_index(folder, jobs=1)
    assert (where / "index.json").read_bytes() == header
    assert sorted(p.name for p in where.iterdir()) == before  # no new array left behind
    monkeypatch.undo()
    assert build_index(folder, jobs=1).num_samples == 5 + 6 + 7 + 5


def test_an_inline_build_writes_the_arrays_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files described in this process hand their span arrays to the write in memory: nothing
    is staged or read back, and the arrays and checksums equal a process pool's."""
    data = _data(tmp_path / "d")
    pooled = build_index(data, index=tmp_path / "pooled", executor="local", jobs=2)
    loads: list[Any] = []
    real_load = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    inline = build_index(data, index=tmp_path / "inline")
    assert not [a for a in loads if ".staging-" in str(a[0])]
    monkeypatch.undo()
    assert inline.num_samples == pooled.num_samples
    heads = [json.loads((tmp_path / i / "index.json").read_text()) for i in ("inline", "pooled")]
    assert heads[0]["checksums"].keys() == heads[1]["checksums"].keys()
    for key in heads[0]["checksums"]:
        path = tmp_path / "inline" / heads[0]["arrays"][key]
        assert heads[0]["checksums"][key] == file_checksum(path)
        want = np.load(tmp_path / "pooled" / heads[1]["arrays"][key])
        np.testing.assert_array_equal(np.load(path), want)


def test_the_index_a_build_returns_is_the_one_open_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build returns the index as written (header parsed from its bytes, arrays mapped),
    without reading it back and checking it: the same header, files, skipped files, arrays and
    samples as DatasetIndex.open of the directory, for span and whole files and a skipped one."""
    from pickleshard.index.model import DatasetIndex

    data = _data(tmp_path / "d")
    xs = [np.full(4, i, np.float32) for i in range(3)]
    (data / "p3.pkl").write_bytes(pickle.dumps((xs, [0, 1, 2]), protocol=1))  # read whole
    (data / "p4.pkl").write_bytes(b"not a pickle")
    opened: list[Any] = []
    real_open = DatasetIndex.open
    monkeypatch.setattr(DatasetIndex, "open", lambda p: opened.append(p) or real_open(p))
    built = build_index(data, skip_bad=True)
    assert opened == []  # nothing read back
    monkeypatch.undo()
    again = DatasetIndex.open(data / ".pickleshard")
    assert built.header == again.header
    assert built.files == again.files
    assert built.skipped == again.skipped
    assert built.modes == again.modes == ("span", "span", "span", "whole")
    assert built.spans.keys() == again.spans.keys()
    for key in again.spans:
        np.testing.assert_array_equal(built.spans[key], again.spans[key])
    np.testing.assert_array_equal(built.samples, again.samples)
    # mapped as np.load maps them: the same class, dtype, shape, offset, and read only
    for mine, theirs in [(built.samples, again.samples)] + [
        (built.spans[k], again.spans[k]) for k in again.spans
    ]:
        assert type(mine) is type(theirs) is np.memmap
        assert (mine.dtype, mine.shape, mine.offset) == (theirs.dtype, theirs.shape, theirs.offset)
        assert not mine.flags.writeable
    assert [built.locate(i) for i in range(len(built))] == [
        again.locate(i) for i in range(len(again))
    ]
