"""What the fault worker makes of a fault case's bytes before an entry point runs: special files,
a built-then-tampered index, and the thread that rewrites a file during an epoch.

:func:`materialise` writes a case into a fresh folder (``data.pkl`` plus the case's extra
files) and applies its ``setup`` (see :mod:`corpus.faults`). Each tamper edits
what :mod:`pickleshard.index` stores in ``.pickleshard/`` (the header ``index.json``, its files
table and scan meta, and the span ``.npy`` arrays), as an attacker shipping a dataset with its
index could.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard.index import fingerprint
from pickleshard.indexing.build import build_index

from .faults import REWRITE_NEW, _good_layout

__all__ = ["DATA_NAME", "Rewriter", "materialise"]

DATA_NAME = "data.pkl"


def materialise(case_dir: Path, meta: dict[str, Any], run_dir: Path) -> Path:
    """Write the case of ``case_dir`` as ``run_dir/data/`` and apply its setup; return the data
    folder. The case's data file is ``f<suffix>`` there; it becomes ``data.pkl``."""
    data = run_dir / "data"
    data.mkdir(parents=True)
    setup = meta["setup"]
    target = data / DATA_NAME
    if setup == "fifo":
        os.mkfifo(target)
    elif setup == "symlink_zero":
        os.symlink("/dev/zero", target)
    else:
        shutil.copyfile(case_dir / f"f{meta['suffix']}", target)
    for name in meta["extra"]:
        if name != REWRITE_NEW:  # the rewrite's second version stays with the case
            shutil.copyfile(case_dir / name, data / name)
    if setup.startswith("tamper:") or setup == "rewrite":
        build_index(data, jobs=1)
    if setup.startswith("tamper:"):
        _TAMPERS[setup.split(":", 1)[1]](data, data / ".pickleshard")
    return data


def _header(index: Path) -> dict[str, Any]:
    header: dict[str, Any] = json.loads((index / "index.json").read_text())
    return header


def _save_header(index: Path, header: dict[str, Any]) -> None:
    (index / "index.json").write_text(json.dumps(header, indent=1))


def _edit_header(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path, Path], None]:
    def tamper(data: Path, index: Path) -> None:
        header = _header(index)
        edit(header)
        _save_header(index, header)

    return tamper


def _array(index: Path, name: str) -> Path:
    return index / str(_header(index)["arrays"][name])


def _edit_array(
    name: str, edit: Callable[[np.ndarray], np.ndarray]
) -> Callable[[Path, Path], None]:
    def tamper(data: Path, index: Path) -> None:
        path = _array(index, name)
        new = edit(np.load(path))
        np.save(path, new, allow_pickle=True)  # the name ends in .npy: saved in place

    return tamper


def _item(header: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = header["files"][0]["scan"]["items"][0]
    return item


def _set_item(key: str, value: Any) -> Callable[[Path, Path], None]:
    return _edit_header(lambda h: _item(h).__setitem__(key, value))


def _shifted(a: np.ndarray) -> np.ndarray:
    out: np.ndarray = a.copy()
    out[:, 0] += 10**6
    return out


def _negative(a: np.ndarray) -> np.ndarray:
    out: np.ndarray = a.copy()
    out[1, 0] = -5
    return out


def _swap_rows(data: Path, index: Path) -> None:
    """Rows 2 and 3 (two samples read raw, not the first, which is unpickled) swapped in every
    per-sample array."""
    for name in ("starts", "ends", "memo_base"):
        path = _array(index, name)
        a = np.load(path)
        a[[2, 3]] = a[[3, 2]]
        np.save(path, a)


def _past_eof(data: Path, index: Path) -> None:
    for name in ("starts", "ends"):
        _edit_array(name, _shifted)(data, index)


def _move_counts(h: dict[str, Any]) -> None:
    h["files"][0]["num_samples"] -= 1
    h["files"][1]["num_samples"] += 1


def _truncate_npy(data: Path, index: Path) -> None:
    path = _array(index, "starts")
    size = path.stat().st_size
    os.truncate(path, size // 2)


def _plant_outside(data: Path) -> Path:
    """A valid pickle of the dataset's layout and size, other values, outside the dataset."""
    outside = data.parent / "outside"
    outside.mkdir(exist_ok=True)
    planted = outside / "a.pkl"
    planted.write_bytes(_good_layout(6, 99))
    return planted


def _escape_file(data: Path, index: Path) -> None:
    planted = _plant_outside(data)
    header = _header(index)
    header["files"][0]["path"] = os.path.relpath(planted, data)
    _save_header(index, header)


def _escape_array(data: Path, index: Path) -> None:
    """``starts``, ``ends`` and ``memo_base`` named by paths outside the index: copies with rows
    2 and 3 swapped (consistent with each other: followed, they give other samples silently)."""
    header = _header(index)
    outside = data.parent / "outside"
    outside.mkdir(exist_ok=True)
    for name in ("starts", "ends", "memo_base"):
        rows = np.load(index / header["arrays"][name])
        rows[[2, 3]] = rows[[3, 2]]
        np.save(outside / f"{name}.npy", rows)
        header["arrays"][name] = os.path.relpath(outside / f"{name}.npy", index)
    _save_header(index, header)


def _edit_shape_keeping_index(data: Path, index: Path) -> None:
    """The shape of one raw-read sample (the third array) edited in the data file, from (2, 3)
    to (3, 2), and the index's size, times, inode and fingerprint of that file refreshed, as
    someone editing data and index together would: the index still says (2, 3)."""
    path = data / DATA_NAME
    raw = bytearray(path.read_bytes())
    shape = b"K\x02K\x03\x86"
    at = -1
    for _ in range(3):
        at = raw.index(shape, at + 1)
    raw[at : at + len(shape)] = b"K\x03K\x02\x86"
    path.write_bytes(bytes(raw))
    st = path.stat()
    header = _header(index)
    entry = next(f for f in header["files"] if f["path"] == DATA_NAME)
    entry.update(
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        ctime_ns=st.st_ctime_ns,
        ino=st.st_ino,
        fingerprint=fingerprint(path),
    )
    _save_header(index, header)


_TAMPERS: dict[str, Callable[[Path, Path], None]] = {
    "item_dtype_object": _set_item("descr", "|O"),
    "item_shape_huge": _set_item("shape", [10**6, 10**6]),
    "starts_dtype_object": _edit_array("starts", lambda a: a.astype(object)),
    "starts_float64": _edit_array("starts", lambda a: a.astype(np.float64)),
    "start_negative": _edit_array("starts", _negative),
    "starts_past_eof": _past_eof,
    "rows_swapped": _swap_rows,
    "counts_moved": _edit_header(_move_counts),
    "npy_truncated": _truncate_npy,
    "file_path_escape": _escape_file,
    "array_path_escape": _escape_array,
    "shape_edited_with_stat": _edit_shape_keeping_index,
}


class Rewriter:
    """A thread that rewrites ``path`` in place, 4 KiB at a time, alternating between the bytes
    of ``versions`` (all the same size), until stopped; ``passes`` counts completed rewrites."""

    def __init__(self, path: Path, versions: tuple[bytes, ...]) -> None:
        self.path, self.versions = path, versions
        self.passes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Rewriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)
        try:
            k = 1
            while not self._stop.is_set():
                data = memoryview(self.versions[k % len(self.versions)])
                for at in range(0, len(data), 4096):
                    os.pwrite(fd, data[at : at + 4096], at)
                self.passes += 1
                k += 1
        finally:
            os.close(fd)
