"""Files without a pickle extension, and Python 2 pickles (crafted here as Python 2.7 writes
them at protocol 2: ``str`` as ``BINSTRING`` bytes, numpy array data in such a ``str``)."""

from __future__ import annotations

import pickle
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import PickleDataset
from pickleshard.errors import NoPickleFilesError, TextEncodingError
from pickleshard.testing import same

HINT = "written by Python 2? pass encoding='latin1' (numpy arrays) or 'bytes'"


class Py2Str(bytes):
    """A Python 2 ``str``: pickled as ``SHORT_BINSTRING`` / ``BINSTRING``."""


class Py2Pickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """Writes what Python 2.7's cPickle wrote at protocol 2 for str and numpy arrays."""

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def save_py2str(self, obj: bytes) -> None:
        n = len(obj)
        head = pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING
        self.write(head if n < 256 else head + struct.pack("<i", n))
        self.write(bytes(obj))
        self.memoize(obj)

    dispatch[Py2Str] = save_py2str

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is np.ndarray:
            from numpy._core.multiarray import _reconstruct

            state = (1, obj.shape, obj.dtype, False, Py2Str(obj.tobytes()))
            return (_reconstruct, (np.ndarray, (0,), Py2Str(b"b")), state)
        return NotImplemented


def _py2_file(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        Py2Pickler(fh, protocol=2).dump(obj)
    return path


def _arrays() -> tuple[list[np.ndarray], list[Py2Str]]:
    xs = [np.arange(6, dtype=np.float64).reshape(2, 3) * 1.7 + k for k in range(4)]
    return xs, [Py2Str(b"caf\xe9"), Py2Str(b"na\xefve"), Py2Str(b"x"), Py2Str(b"\xff")]


def test_directory_without_pickle_extensions_names_what_it_found(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    for k in range(1, 6):
        with open(folder.joinpath(f"data_batch_{k}") if folder.exists() else _mk(folder, k), "wb"):
            pass
    (folder / "readme.html").write_text("<p>")
    with pytest.raises(NoPickleFilesError) as info:
        PickleDataset(folder)
    text = str(info.value)
    assert "found 6 other file(s) (5 (no extension), 1 .html)" in text
    assert "data_batch_1, data_batch_2" in text
    assert f"PickleDataset({str(folder / '**' / '*')!r})" in text
    assert "PickleDataset([file, ...])" in text


def _mk(folder: Path, k: int) -> Path:
    folder.mkdir(parents=True)
    return folder / f"data_batch_{k}"


def test_glob_reads_files_of_any_name(tmp_path: Path) -> None:
    for k in range(2):
        p = tmp_path / "d" / f"data_batch_{k}"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(pickle.dumps(([k, k + 1], [0, 1]), 2))
    ds = PickleDataset(str(tmp_path / "d" / "data_batch_*"), jobs=1)
    assert [ds[i] for i in range(4)] == [(0, 0), (1, 1), (1, 0), (2, 1)]


@pytest.mark.parametrize("mode", ["auto", "whole"])
def test_python2_pickle_says_which_encoding_to_pass(tmp_path: Path, mode: str) -> None:
    path = _py2_file(tmp_path / "d" / "a.pkl", _arrays())
    with pytest.raises(TextEncodingError) as info:
        # whole: the index build loads the file; auto: its arrays are read by span, at ds[0]
        PickleDataset(tmp_path / "d", jobs=1, mode=mode)[0]  # type: ignore[arg-type]
    text = str(info.value)
    assert HINT in text
    assert str(path) in text
    assert info.value.offset is not None
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("encoding", ["latin1", "bytes"])
def test_python2_pickle_reads_with_the_encoding(tmp_path: Path, encoding: str) -> None:
    path = _py2_file(tmp_path / "d" / "a.pkl", _arrays())
    with open(path, "rb") as fh:
        want = pickle.load(fh, encoding=encoding)
    ds = PickleDataset(tmp_path / "d", jobs=1, encoding=encoding)
    got = [ds[i] for i in range(len(ds))]
    assert all(same(g, (x, y)) for g, x, y in zip(got, want[0], want[1], strict=True))


def test_python2_str_met_in_a_span_read_names_the_hint(tmp_path: Path) -> None:
    """Labels only (no arrays): the scan reads spans; the str is decoded at ds[i]."""
    _py2_file(tmp_path / "d" / "a.pkl", ([1, 2, 3], [Py2Str(b"ok"), Py2Str(b"\xe9t\xe9"), 3]))
    ds = PickleDataset(tmp_path / "d", jobs=1)
    assert ds[0] == (1, "ok")
    with pytest.raises(TextEncodingError, match=re.escape(HINT)):
        ds[1]
    assert PickleDataset(tmp_path / "d", jobs=1, encoding="latin1")[1] == (2, "été")
