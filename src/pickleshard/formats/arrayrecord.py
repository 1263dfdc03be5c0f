"""ArrayRecord: Google's random-access record files, read by ``array_record`` and by grain.

On disk::

    OUT/data-<k>-of-<n>.array_record   one file per conversion part (k, n five digits), in
                                       sample order: sample ``i`` is record ``i`` of the files
                                       taken in name order (``ArrayRecordDataSource(sorted(
                                       glob("OUT/*.array_record")))[i]``); written uncompressed,
                                       ``group_size:1`` (a random read decodes one record)
    OUT/pickleshard.json               descriptor: "record_encoding": "npy-concat",
                                       "shards": [{"file", "count"}, ...], "fields": [{"name"}]
    OUT/hashes.npy                     uint8 (N, 16) content digests (pickleshard.formats.base)

**A record is one sample, as ``.npy`` files written one after another** (``np.save`` to one
file, then ``np.load`` from it in turn, as numpy's own ``np.save`` documentation shows): first
a ``uint8`` array of one *kind* per field, then one array per field, in the descriptor's field
order. Plain numpy decodes it::

    f = io.BytesIO(record)
    kinds = np.load(f, allow_pickle=False)
    x, y = (np.load(f, allow_pickle=False) for _ in kinds)   # then by kind: y = int(y)

====  ========  ===========================================================================
kind  value     the field's array
====  ========  ===========================================================================
0     ndarray   itself, any dtype but ``object`` (shape and dtype, byte order included)
1     numpy     the 0-d array of the scalar (``np.float32(1.5)``): the value is ``a[()]``
      scalar
2     int       0-d ``int64`` (a Python int in the int64 range): ``int(a)``
3     float     0-d ``float64``: ``float(a)``
4     bool      0-d ``bool``: ``bool(a)``
5     str       0-d ``<U`` (a str numpy keeps exactly: no trailing NUL): ``str(a)``
6     bytes     1-d ``uint8``: ``a.tobytes()``
7     other     1-d ``uint8`` holding the value pickled (protocol 5; loaded under the reader's
              restricted unpickling policy;
                a plain decoder is in docs/formats-arrow.md): dicts, tuples, None, big
                ints, object arrays, tensors...
====  ========  ===========================================================================

Writing: each part's worker encodes its samples straight into the part's ArrayRecord file (in
parallel); finalizing hard-links the parts' files into place (a copy where links fail), so it
neither reads nor holds sample data. Memory: a record, and ArrayRecord's writer buffers.
Reading (:class:`ArrayRecordDataset`): a batch's indices grouped by file, one ``read`` per
file. Needs ``pip install 'pickleshard[arrayrecord]'`` (array-record).
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
from collections.abc import Callable, Sequence
from enum import IntEnum
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import ConvertedDatasetError, MissingDependencyError
from ..io.handles import ProcessLocal
from ..safety import DEFAULT_POLICY, UnpicklePolicy
from .base import (
    ConvertedDataset,
    Format,
    PartResult,
    PartSpec,
    PartWriter,
    ReadOptions,
    Sample,
    WriteOptions,
)
from .encoding import MemberKind, decode_member, pickle_value
from .registry import register_format

__all__ = [
    "ArrayRecordDataset",
    "ArrayRecordFormat",
    "RecordKind",
    "decode_record",
    "encode_record",
]

RECORD_ENCODING = "npy-concat"
WRITER_OPTIONS = "group_size:1,uncompressed"
READER_OPTIONS = "readahead_buffer_size:0"  # random access: no read-ahead (grain's setting)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class RecordKind(IntEnum):
    """How one field's value is stored in a record (module docstring)."""

    ARRAY = 0
    SCALAR = 1
    INT = 2
    FLOAT = 3
    BOOL = 4
    STR = 5
    BYTES = 6
    PICKLE = 7


def import_array_record() -> ModuleType:
    """``array_record``'s reader/writer module, or :class:`MissingDependencyError`."""
    try:
        from array_record.python import array_record_module
    except ImportError:
        raise MissingDependencyError(
            "array-record", "arrayrecord", "the ArrayRecord format"
        ) from None
    return array_record_module  # type: ignore[no-any-return]  # untyped (ignore_missing_imports)


def _member(value: Any) -> tuple[RecordKind, np.ndarray[Any, Any]]:
    t = type(value)
    if t is np.ndarray and not value.dtype.hasobject:
        return RecordKind.ARRAY, value
    if isinstance(value, np.generic) and not value.dtype.hasobject:
        return RecordKind.SCALAR, np.asarray(value)
    if t is bool:
        return RecordKind.BOOL, np.array(value)
    if t is int and _INT64_MIN <= value <= _INT64_MAX:
        return RecordKind.INT, np.array(value, dtype=np.int64)
    if t is float:
        return RecordKind.FLOAT, np.array(value, dtype=np.float64)
    if t is str:
        arr = np.array(value)
        if arr.dtype.kind == "U" and arr.item() == value:  # numpy drops trailing NULs
            return RecordKind.STR, arr
    if t is bytes:
        return RecordKind.BYTES, np.frombuffer(value, dtype=np.uint8)
    return RecordKind.PICKLE, np.frombuffer(pickle_value(value), dtype=np.uint8)


def encode_record(sample: Sample) -> bytes:
    """One sample as a record (module docstring); ``TypeError`` for a value pickle cannot write."""
    members = [_member(v) for v in sample]
    out = io.BytesIO()
    np.lib.format.write_array(
        out, np.array([k for k, _ in members], dtype=np.uint8), allow_pickle=False
    )
    for _, arr in members:
        np.lib.format.write_array(out, arr, allow_pickle=False)
    return out.getvalue()


def _value(kind: int, arr: np.ndarray[Any, Any], unpickle: Callable[[bytes], Any]) -> Any:
    if kind == RecordKind.ARRAY:
        return arr
    if kind == RecordKind.SCALAR:
        return arr[()]
    if kind == RecordKind.INT:
        return int(arr)
    if kind == RecordKind.FLOAT:
        return float(arr)
    if kind == RecordKind.BOOL:
        return bool(arr)
    if kind == RecordKind.STR:
        return str(arr.item())
    if kind == RecordKind.BYTES:
        return arr.tobytes()
    if kind == RecordKind.PICKLE:
        return unpickle(arr.tobytes())
    raise ValueError(f"unknown record kind {kind}")


def decode_record(
    record: bytes,
    fields: int,
    policy: UnpicklePolicy = DEFAULT_POLICY,
    path: str = "",
    sample: int | None = None,
) -> Sample:
    """The sample a record holds, its pickled values loaded under ``policy`` (a refusal names
    ``path`` and ``sample``); ``ValueError`` if it is not a record of ``fields`` fields."""

    def unpickle(data: bytes) -> Any:
        return decode_member(MemberKind.PICKLE, data, policy, path, sample)

    f = io.BytesIO(record)
    kinds = np.load(f, allow_pickle=False)
    if kinds.dtype != np.uint8 or kinds.shape != (fields,):
        raise ValueError(f"the record's kinds are {kinds.dtype}{kinds.shape}, expected ({fields},)")
    values = tuple(_value(int(k), np.load(f, allow_pickle=False), unpickle) for k in kinds)
    if f.tell() != len(record):
        raise ValueError(f"{len(record) - f.tell()} bytes follow the record's last field")
    return values


class ArrayRecordPartWriter(PartWriter):
    """Encodes the part's samples into ``part.array_record``."""

    def __init__(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> None:
        super().__init__(part_dir, spec, options)
        module = import_array_record()
        self.writer = module.ArrayRecordWriter(str(part_dir / "part.array_record"), WRITER_OPTIONS)
        self.count = 0

    def write(self, index: int, sample: Sample) -> None:
        self.writer.write(encode_record(sample))
        self.count += 1

    def close(self) -> dict[str, Any]:
        self.writer.close()
        return {"count": self.count}


class ArrayRecordFormat(Format):
    """The ArrayRecord format (module docstring)."""

    name = "arrayrecord"

    def __init__(self) -> None:
        if importlib.util.find_spec("array_record") is None:
            raise MissingDependencyError("array-record", "arrayrecord", "the ArrayRecord format")

    def part_writer(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> PartWriter:
        return ArrayRecordPartWriter(part_dir, spec, options)

    def finalize(
        self, staging: Path, parts: Sequence[PartResult], options: WriteOptions
    ) -> dict[str, Any]:
        shards = []
        filled = [p for p in parts if int(p.summary["count"])]
        for k, part in enumerate(filled):
            name = f"data-{k:05d}-of-{len(filled):05d}.array_record"
            src, dst = part.dir / "part.array_record", staging / name
            try:  # the part's file stays as it is: a rerun of finalize links it again
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
            shards.append({"file": name, "count": int(part.summary["count"])})
        return {
            "fields": [{"name": name} for name in options.fields],
            "record_encoding": RECORD_ENCODING,
            "shards": shards,
        }

    def open(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions
    ) -> ConvertedDataset:
        return ArrayRecordDataset(root, descriptor, options.policy)


class ArrayRecordDataset(ConvertedDataset):
    """Reads an ArrayRecord conversion (module docstring)."""

    def __init__(
        self, root: Path, descriptor: dict[str, Any], policy: UnpicklePolicy = DEFAULT_POLICY
    ) -> None:
        super().__init__(root, descriptor, policy)
        try:
            shards = descriptor["shards"]
            self.files = [root / str(s["file"]) for s in shards]
            counts = np.array([int(s["count"]) for s in shards], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(f"the descriptor's shard entries are damaged: {exc!r}") from None
        if descriptor.get("record_encoding") != RECORD_ENCODING:
            raise self._corrupt(
                f"record encoding {descriptor.get('record_encoding')!r}, this pickleshard reads "
                f"{RECORD_ENCODING!r}: convert again"
            )
        if int(counts.sum()) != len(self):
            raise self._corrupt(
                f"the shards hold {int(counts.sum())} samples, expected {len(self)}"
            )
        self.counts = counts
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        files, want = self.files, counts.tolist()
        self._readers = ProcessLocal(lambda: _open_readers(files, want), _close_readers)
        self._readers.get()  # fail here, naming the file, rather than at the first read

    def _get(self, i: int) -> Sample:
        return self._get_many(np.array([i], dtype=np.int64))[0]

    def _get_many(self, idx: np.ndarray[Any, Any]) -> list[Sample]:
        readers = self._readers.get()
        shard = np.searchsorted(self.starts, idx, side="right") - 1
        out: list[Sample | None] = [None] * len(idx)
        for s in np.unique(shard).tolist():
            where = np.flatnonzero(shard == s)
            local = (idx[where] - self.starts[s]).tolist()
            records = self._read(readers[s], s, local)
            for pos, record, j in zip(where.tolist(), records, local, strict=True):
                out[pos] = self._decode(record, int(self.starts[s]) + j)
        return out  # type: ignore[return-value]

    def _read(self, reader: Any, s: int, local: list[int]) -> list[bytes]:
        try:
            return list(reader.read(local))
        except (RuntimeError, ValueError, OSError):
            pass
        for j in local:  # find the sample whose record cannot be read
            try:
                reader.read([j])
            except (RuntimeError, ValueError, OSError) as exc:
                raise self._corrupt(
                    f"cannot read record {j} of {self.files[s].name}: {exc}",
                    int(self.starts[s]) + j,
                ) from None
        raise self._corrupt(f"cannot read from {self.files[s].name}", int(self.starts[s]))

    def _decode(self, record: bytes, i: int) -> Sample:
        try:
            return decode_record(record, len(self.fields), self.policy, os.fspath(self.root), i)
        except ValueError as exc:
            raise self._corrupt(f"cannot decode the record: {exc}", i) from None

    def __reduce__(self) -> tuple[Any, ...]:
        return (ArrayRecordDataset, (self.root, self.descriptor, self.policy))


def _open_readers(files: list[Path], counts: list[int]) -> list[Any]:
    module = import_array_record()
    readers = []
    for path, count in zip(files, counts, strict=True):
        try:
            reader = module.ArrayRecordReader(str(path), READER_OPTIONS)
        except (RuntimeError, ValueError, OSError) as exc:
            raise ConvertedDatasetError(path, f"cannot open the ArrayRecord file: {exc}") from None
        if reader.num_records() != count:
            raise ConvertedDatasetError(
                path, f"holds {reader.num_records()} records, the descriptor says {count}"
            )
        readers.append(reader)
    return readers


def _close_readers(readers: list[Any]) -> None:
    for reader in readers:
        reader.close()


register_format(ArrayRecordFormat)
