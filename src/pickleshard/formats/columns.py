"""Columns for the memmap format: written per part as typed segments, merged into ``.npy`` files.

A part writes each field as a run of *segments*; a segment holds consecutive values of one
*signature*: ``array`` (ndarrays of one dtype and ndim, any shapes), ``scalar`` (numpy scalars
of one dtype), ``int`` / ``float`` / ``bool`` (Python scalars; ints within int64), or ``object``
(anything, through :func:`~pickleshard.formats.encoding.encode_member`: pickled if nothing plainer fits). A value that does not
fit the open segment starts a new one; after :data:`MAX_SEGMENTS` segments a column takes
everything as ``object``. Segment files are raw (no header), named ``c<field>.<segment>.<what>``:
``data`` (values' bytes), ``shapes`` (int64 per array value), ``lengths`` and ``kinds`` (object).

:func:`merge_column` streams every part's segments of one field into the final files. When all
segments share one signature the field keeps it (``array`` becomes ``ragged`` if shapes differ);
otherwise it becomes ``object`` and values are re-encoded one by one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..safety import UnpicklePolicy
from ..scan.dtypes import dtype_from_json, dtype_to_json
from .encoding import decode_member, encode_member, raw_bytes
from .files import NpyWriter, copy_bytes, iter_raw_chunks

__all__ = ["MAX_SEGMENTS", "ColumnWriter", "merge_column"]

MAX_SEGMENTS = 8
_FLUSH = 1 << 16
_BUFFER = 1 << 20
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# Part files are this conversion's own, written moments ago from values the source's policy let
# through: reading them back must not refuse a global that policy allowed.
_OWN_PARTS = UnpicklePolicy(trusted=True)
_PYTHON = {"int": np.dtype(np.int64), "float": np.dtype(np.float64), "bool": np.dtype(np.bool_)}


def _signature(value: Any) -> tuple[Any, ...]:
    t = type(value)
    if t is np.ndarray and not value.dtype.hasobject:
        return ("array", value.dtype, value.ndim)
    if isinstance(value, np.generic) and not value.dtype.hasobject:
        return ("scalar", value.dtype)
    if t is int:
        return ("int",) if _INT64_MIN <= value <= _INT64_MAX else ("object",)
    if t is float:
        return ("float",)
    if t is bool:
        return ("bool",)
    return ("object",)


class _Segment:
    def __init__(self, base: Path, sig: tuple[Any, ...]) -> None:
        self.sig = sig
        self.kind: str = sig[0]
        self.dtype: np.dtype[Any] | None = sig[1] if self.kind in ("array", "scalar") else None
        self.count = 0
        self.nbytes = 0
        self.shape: tuple[int, ...] | None = None
        self.uniform = True
        self.pending: list[Any] = []
        self.lengths: list[int] = []
        self.kinds: list[int] = []
        self.files: dict[str, IO[bytes]] = {"data": open(f"{base}.data", "wb", _BUFFER)}  # noqa: SIM115
        if self.kind == "array":
            self.files["shapes"] = open(f"{base}.shapes", "wb", _BUFFER)  # noqa: SIM115
        if self.kind == "object":
            self.files["lengths"] = open(f"{base}.lengths", "wb", _BUFFER)  # noqa: SIM115
            self.files["kinds"] = open(f"{base}.kinds", "wb", _BUFFER)  # noqa: SIM115

    def fits(self, value: Any) -> bool:
        if self.kind == "object":
            return True
        if self.kind == "array":
            return (
                type(value) is np.ndarray
                and value.dtype == self.dtype
                and value.ndim == self.sig[2]
            )
        return _signature(value) == self.sig

    def append(self, value: Any) -> None:
        self.count += 1
        if self.kind == "array":
            raw = raw_bytes(value)
            self.files["data"].write(raw)
            self.nbytes += len(raw)
            if self.shape is None:
                self.shape = value.shape
            elif self.uniform and value.shape != self.shape:
                self.uniform = False
            self.pending.append(value.shape)
        elif self.kind == "object":
            kind, data = encode_member(value)
            self.files["data"].write(data)
            self.nbytes += len(data)
            self.lengths.append(len(data))
            self.kinds.append(int(kind))
        else:
            self.pending.append(value)
        if len(self.pending) >= _FLUSH or len(self.lengths) >= _FLUSH:
            self.flush()

    def flush(self) -> None:
        if self.kind == "array":
            if self.pending and self.sig[2]:
                np.array(self.pending, dtype=np.int64).tofile(self.files["shapes"])
        elif self.kind == "object":
            np.array(self.lengths, dtype=np.int64).tofile(self.files["lengths"])
            np.array(self.kinds, dtype=np.uint8).tofile(self.files["kinds"])
            self.lengths.clear()
            self.kinds.clear()
        elif self.pending:
            dtype = self.dtype if self.dtype is not None else _PYTHON[self.kind]
            block = np.array(self.pending, dtype=dtype)
            self.files["data"].write(raw_bytes(block))
            self.nbytes += block.nbytes
        self.pending.clear()

    def close(self) -> dict[str, Any]:
        self.flush()
        for fh in self.files.values():
            fh.close()
        return {
            "kind": self.kind,
            "dtype": None if self.dtype is None else dtype_to_json(self.dtype),
            "ndim": self.sig[2] if self.kind == "array" else None,
            "count": self.count,
            "nbytes": self.nbytes,
            "shape": None if self.shape is None or not self.uniform else list(self.shape),
        }


class ColumnWriter:
    """Writes one field of one part as segments (module docstring); memory is O(1) in values."""

    def __init__(self, part_dir: Path, field: int) -> None:
        self.part_dir = part_dir
        self.field = field
        self.segments: list[dict[str, Any]] = []
        self._open: _Segment | None = None

    def append(self, value: Any) -> None:
        seg = self._open
        if seg is None or not seg.fits(value):
            if seg is not None:
                self.segments.append(seg.close())
            sig = _signature(value) if len(self.segments) < MAX_SEGMENTS else ("object",)
            seg = self._open = _Segment(self.part_dir / f"c{self.field}.{len(self.segments)}", sig)
        seg.append(value)

    def close(self) -> list[dict[str, Any]]:
        if self._open is not None:
            self.segments.append(self._open.close())
            self._open = None
        return self.segments


# ---- merging ----------------------------------------------------------------------------------

SegmentRef = tuple[Path, dict[str, Any]]  # (segment file base, segment summary)


def _merged_kind(segments: Sequence[SegmentRef]) -> dict[str, Any]:
    sigs = {(s["kind"], str(s["dtype"]), s["ndim"]) for _, s in segments}
    if len(sigs) != 1 or segments[0][1]["kind"] == "object":
        return {"kind": "object"}
    first = segments[0][1]
    if first["kind"] != "array":
        return {"kind": first["kind"], "dtype": first["dtype"]}
    shapes = {None if s["shape"] is None else tuple(s["shape"]) for _, s in segments}
    if len(shapes) == 1 and None not in shapes:
        return {"kind": "array", "dtype": first["dtype"], "shape": first["shape"]}
    return {"kind": "ragged", "dtype": first["dtype"], "ndim": first["ndim"]}


def _segment_shapes(base: Path, seg: dict[str, Any]) -> Iterator[np.ndarray[Any, Any]]:
    ndim = seg["ndim"]
    if ndim == 0:
        yield np.zeros((seg["count"], 0), dtype=np.int64)
        return
    yield from iter_raw_chunks(Path(f"{base}.shapes"), np.dtype(np.int64), ndim)


def iter_segment(base: Path, seg: dict[str, Any]) -> Iterator[Any]:
    """The values of one segment, as the source held them."""
    kind = seg["kind"]
    if kind == "object":
        lengths = np.fromfile(f"{base}.lengths", dtype=np.int64)
        kinds = np.fromfile(f"{base}.kinds", dtype=np.uint8)
        with open(f"{base}.data", "rb") as fh:
            for n, k in zip(lengths.tolist(), kinds.tolist(), strict=True):
                yield decode_member(k, fh.read(n), _OWN_PARTS, os.fspath(base))
        return
    if kind == "array":
        dtype = dtype_from_json(seg["dtype"])
        with open(f"{base}.data", "rb") as fh:
            for shapes in _segment_shapes(base, seg):
                for shape in shapes:
                    size = int(np.prod(shape)) * dtype.itemsize
                    flat = np.frombuffer(fh.read(size), dtype=dtype) if size else np.empty(0, dtype)
                    yield flat.reshape(tuple(shape)).copy()
        return
    dtype = _PYTHON.get(kind) or dtype_from_json(seg["dtype"])
    for chunk in iter_raw_chunks(Path(f"{base}.data"), dtype):
        if kind == "scalar":
            yield from (chunk[k] for k in range(len(chunk)))
        else:
            yield from chunk.tolist()


def merge_column(
    out_dir: Path, stem: str, name: str, segments: Sequence[SegmentRef], num_samples: int
) -> dict[str, Any]:
    """Write the final files of one field from its segments; return its descriptor entry."""
    merged = _merged_kind(segments) if segments else {"kind": "object"}
    entry: dict[str, Any] = {"name": name, **merged}
    kind = entry["kind"]
    if kind == "object":
        entry["files"] = _merge_objects(out_dir, stem, segments, num_samples)
    elif kind == "ragged":
        entry["files"] = _merge_ragged(out_dir, stem, segments, num_samples, entry["ndim"])
    else:
        dtype = _PYTHON.get(kind) or dtype_from_json(entry["dtype"])
        shape = (num_samples, *entry.get("shape", []))
        writer = NpyWriter(out_dir / f"{stem}.npy", dtype, shape)
        for base, _ in segments:
            writer.copy_from(Path(f"{base}.data"))
        writer.close()
        entry["files"] = {"data": f"{stem}.npy"}
    return entry


def _merge_ragged(
    out_dir: Path, stem: str, segments: Sequence[SegmentRef], num_samples: int, ndim: int
) -> dict[str, str]:
    dtype = dtype_from_json(segments[0][1]["dtype"])
    itemsize = max(1, dtype.itemsize)
    elements = sum(s["nbytes"] for _, s in segments) // itemsize
    names = {"values": f"{stem}.values.npy", "offsets": f"{stem}.offsets.npy"}
    names["shapes"] = f"{stem}.shapes.npy"
    values = NpyWriter(out_dir / names["values"], dtype, (elements,))
    offsets = NpyWriter(out_dir / names["offsets"], np.dtype(np.int64), (num_samples + 1,))
    shapes = NpyWriter(out_dir / names["shapes"], np.dtype(np.int64), (num_samples, ndim))
    offsets.write(np.zeros(1, dtype=np.int64))
    end = 0
    for base, seg in segments:
        values.copy_from(Path(f"{base}.data"))
        for chunk in _segment_shapes(base, seg):
            shapes.write(chunk)
            ends = end + np.cumsum(np.prod(chunk, axis=1, dtype=np.int64))
            offsets.write(ends)
            end = int(ends[-1]) if len(ends) else end
    for w in (values, offsets, shapes):
        w.close()
    return names


class _StagedBytes:
    """A plain side file with :class:`NpyWriter`'s ``write``/``copy_from``."""

    def __init__(self, path: Path) -> None:
        self.fh: IO[bytes] = open(path, "wb", _BUFFER)  # noqa: SIM115 - closed by the caller

    def write(self, data: Any) -> None:
        self.fh.write(data)

    def copy_from(self, src: Path) -> None:
        copy_bytes(src, self.fh)


def _merge_objects(
    out_dir: Path, stem: str, segments: Sequence[SegmentRef], num_samples: int
) -> dict[str, str]:
    names = {
        "kinds": f"{stem}.kinds.npy",
        "values": f"{stem}.values.npy",
        "offsets": f"{stem}.offsets.npy",
    }
    kinds_w = NpyWriter(out_dir / names["kinds"], np.dtype(np.uint8), (num_samples,))
    offsets = NpyWriter(out_dir / names["offsets"], np.dtype(np.int64), (num_samples + 1,))
    offsets.write(np.zeros(1, dtype=np.int64))
    # Values re-encoded from non-object segments have sizes known only once encoded: those
    # are staged in a side file first; an all-object column streams straight into place.
    direct = all(s["kind"] == "object" for _, s in segments)
    staged = out_dir / f"{stem}.values.staged"
    target: NpyWriter | _StagedBytes
    if direct:
        total = sum(s["nbytes"] for _, s in segments)
        target = NpyWriter(out_dir / names["values"], np.dtype(np.uint8), (total,))
    else:
        target = _StagedBytes(staged)
    end = 0

    def add(lens: np.ndarray[Any, Any], kinds: np.ndarray[Any, Any] | None) -> None:
        nonlocal end
        ends = end + np.cumsum(lens, dtype=np.int64)
        offsets.write(ends)
        end = int(ends[-1]) if len(ends) else end
        if kinds is not None:
            kinds_w.write(kinds)

    for base, seg in segments:
        if seg["kind"] == "object":
            for lens in iter_raw_chunks(Path(f"{base}.lengths"), np.dtype(np.int64)):
                add(lens, None)
            kinds_w.copy_from(Path(f"{base}.kinds"))
            target.copy_from(Path(f"{base}.data"))
            continue
        k_list: list[int] = []
        l_list: list[int] = []
        for value in iter_segment(base, seg):
            kind, blob = encode_member(value)
            target.write(blob)
            k_list.append(int(kind))
            l_list.append(len(blob))
            if len(l_list) >= _FLUSH:
                add(np.array(l_list, dtype=np.int64), np.array(k_list, dtype=np.uint8))
                k_list.clear()
                l_list.clear()
        add(np.array(l_list, dtype=np.int64), np.array(k_list, dtype=np.uint8))
    if isinstance(target, _StagedBytes):
        target.fh.close()
        values = NpyWriter(out_dir / names["values"], np.dtype(np.uint8), (end,))
        values.copy_from(staged)
        staged.unlink()
    else:
        values = target
    for w in (values, kinds_w, offsets):
        w.close()
    return names
