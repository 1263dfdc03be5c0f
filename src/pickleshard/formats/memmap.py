"""memmap: one ``.npy`` file (or three) per field, read by ``np.load(..., mmap_mode="r")``.

On disk (``<stem>`` is the field name made file-safe: ``x``, ``y``, ...)::

    OUT/pickleshard.json        descriptor; "fields" says each field's kind and files
    OUT/hashes.npy              uint8 (N, 16) content digests (see pickleshard.formats.base)
    kind "array"   OUT/<stem>.npy            (N, *shape) of the dtype: every value an ndarray
                                             of one dtype and shape; row i is sample i
    kind "int"     OUT/<stem>.npy            (N,) int64: Python ints (labels)
    kind "float"   OUT/<stem>.npy            (N,) float64: Python floats
    kind "bool"    OUT/<stem>.npy            (N,) bool: Python bools
    kind "scalar"  OUT/<stem>.npy            (N,) of the dtype: numpy scalars (np.float32(…))
    kind "ragged"  OUT/<stem>.values.npy     (E,) of the dtype: all values' elements, C order
                   OUT/<stem>.offsets.npy    (N + 1,) int64: value i is values[o[i]:o[i+1]]
                   OUT/<stem>.shapes.npy     (N, ndim) int64: ... reshaped to shapes[i]
    kind "object"  OUT/<stem>.kinds.npy      (N,) uint8: the member kind of value i
                   OUT/<stem>.values.npy     (B,) uint8: every value's encoded bytes
                   OUT/<stem>.offsets.npy    (N + 1,) int64: value i is values[o[i]:o[i+1]]

A field is ``ragged`` when its arrays share a dtype and ndim but not a shape, ``object`` when its
values mix types (or are str, list, dict...). Object values are members in the plain encodings
of :mod:`pickleshard.formats.encoding`, ``kinds`` saying which: 0 ``.npy``, 1 ``.npy`` of a numpy
scalar, 2 decimal int, 3 UTF-8 text, 4 JSON, 5 pickle protocol 5 (anything else; read back
under the reader's restricted unpickling policy). Every
numpy dtype except ``object`` is stored natively: bool, (u)int8-64, float16-64, complex,
datetime64, timedelta64, fixed-width str/bytes, structured. Object-dtype arrays become
``object`` values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..safety import DEFAULT_POLICY, UnpicklePolicy
from ..scan.dtypes import dtype_from_json
from .base import (
    ConvertedDataset,
    Format,
    PartResult,
    PartSpec,
    PartWriter,
    ReadOptions,
    Sample,
    WriteOptions,
    field_stems,
)
from .columns import ColumnWriter, merge_column
from .npy import map_npy
from .registry import register_format

__all__ = ["MemmapDataset", "MemmapFormat"]


class MemmapPartWriter(PartWriter):
    """One :class:`~pickleshard.formats.columns.ColumnWriter` per field."""

    def __init__(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> None:
        super().__init__(part_dir, spec, options)
        self.columns = [ColumnWriter(part_dir, k) for k in range(len(options.fields))]

    def write(self, index: int, sample: Sample) -> None:
        for column, value in zip(self.columns, sample, strict=True):
            column.append(value)

    def close(self) -> dict[str, Any]:
        return {"segments": [c.close() for c in self.columns]}


class MemmapFormat(Format):
    """The memmap format (module docstring)."""

    name = "memmap"

    def part_writer(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> PartWriter:
        return MemmapPartWriter(part_dir, spec, options)

    def finalize(
        self, staging: Path, parts: Sequence[PartResult], options: WriteOptions
    ) -> dict[str, Any]:
        fields = []
        for k, (name, stem) in enumerate(
            zip(options.fields, field_stems(options.fields), strict=True)
        ):
            segments = [
                (part.dir / f"c{k}.{s}", seg)
                for part in parts
                for s, seg in enumerate(part.summary["segments"][k])
            ]
            fields.append(merge_column(staging, stem, name, segments, options.num_samples))
        return {"fields": fields}

    def open(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions
    ) -> ConvertedDataset:
        return MemmapDataset(root, descriptor, options.policy)


# ---- reading ----------------------------------------------------------------------------------


def _load(root: Path, name: str) -> np.ndarray[Any, Any]:
    return map_npy(root / name)


class _Column:
    def get(self, i: int) -> Any:
        raise NotImplementedError

    def take(self, idx: np.ndarray[Any, Any]) -> list[Any]:
        return [self.get(int(i)) for i in idx]


class _ArrayColumn(_Column):
    def __init__(self, data: np.ndarray[Any, Any]) -> None:
        self.data = data
        self.zero_d = data.ndim == 1  # per-sample 0-d arrays: index with ``...`` to keep arrays

    def get(self, i: int) -> Any:
        return self.data[i, ...].copy()

    def take(self, idx: np.ndarray[Any, Any]) -> list[Any]:
        batch = self.data[idx]
        return [batch[k, ...] for k in range(len(batch))] if self.zero_d else list(batch)


class _ScalarColumn(_Column):
    """Python scalars (``tolist`` gives int/float/bool) or numpy scalars (plain indexing)."""

    def __init__(self, data: np.ndarray[Any, Any], python: bool) -> None:
        self.data = data
        self.python = python

    def get(self, i: int) -> Any:
        return self.data[i].item() if self.python else self.data[i]

    def take(self, idx: np.ndarray[Any, Any]) -> list[Any]:
        picked = self.data[idx]
        return picked.tolist() if self.python else list(picked)


class _RaggedColumn(_Column):
    def __init__(
        self,
        values: np.ndarray[Any, Any],
        offsets: np.ndarray[Any, Any],
        shapes: np.ndarray[Any, Any],
    ) -> None:
        self.values, self.offsets, self.shapes = values, offsets, shapes

    def get(self, i: int) -> Any:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.values[a:b].reshape(tuple(self.shapes[i].tolist())).copy()


class _ObjectColumn(_Column):
    def __init__(
        self,
        kinds: np.ndarray[Any, Any],
        values: np.ndarray[Any, Any],
        offsets: np.ndarray[Any, Any],
        decode: Callable[[int, memoryview, int], Any],
        fail: Callable[[str, int], Exception],
    ) -> None:
        self.kinds, self.values, self.offsets = kinds, values, offsets
        self.decode, self.fail = decode, fail

    def get(self, i: int) -> Any:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        if not 0 <= a <= b <= len(self.values):
            raise self.fail(f"offsets [{a}, {b}) fall outside the values array", i)
        return self.decode(int(self.kinds[i]), self.values[a:b].data, i)


class MemmapDataset(ConvertedDataset):
    """Reads a memmap conversion; arrays stay memory-mapped, shared by forked workers."""

    def __init__(
        self, root: Path, descriptor: dict[str, Any], policy: UnpicklePolicy = DEFAULT_POLICY
    ) -> None:
        super().__init__(root, descriptor, policy)
        try:
            self.columns = [self._column(f) for f in descriptor["fields"]]
        except (OSError, ValueError, KeyError) as exc:
            raise self._corrupt(f"cannot open the field arrays: {exc}") from None

    def _column(self, field: dict[str, Any]) -> _Column:
        files, kind = field["files"], field["kind"]
        n = len(self)
        if kind == "object":
            kinds, offsets = _load(self.root, files["kinds"]), _load(self.root, files["offsets"])
            values = _load(self.root, files["values"])
            self._expect(field, len(kinds) == n and len(offsets) == n + 1)
            return _ObjectColumn(kinds, values, offsets, self._decode_value, self._fail)
        if kind == "ragged":
            values, offsets = _load(self.root, files["values"]), _load(self.root, files["offsets"])
            shapes = _load(self.root, files["shapes"])
            self._expect(field, len(offsets) == n + 1 and len(shapes) == n)
            self._expect(field, values.dtype == dtype_from_json(field["dtype"]))
            return _RaggedColumn(values, offsets, shapes)
        data = _load(self.root, files["data"])
        self._expect(field, len(data) == n)
        if kind == "array":
            self._expect(field, data.shape[1:] == tuple(field["shape"]))
            return _ArrayColumn(data)
        return _ScalarColumn(data, python=kind in ("int", "float", "bool"))

    def _expect(self, field: dict[str, Any], ok: bool) -> None:
        if not ok:
            raise ValueError(f"the arrays of field {field['name']!r} do not match the descriptor")

    def _fail(self, message: str, sample: int) -> Exception:
        return self._corrupt(message, sample)

    def _get(self, i: int) -> Sample:
        return tuple([c.get(i) for c in self.columns])

    def _get_many(self, idx: np.ndarray[Any, Any]) -> list[Sample]:
        return list(zip(*[c.take(idx) for c in self.columns], strict=True))

    def __reduce__(self) -> tuple[Any, ...]:
        return (MemmapDataset, (self.root, self.descriptor, self.policy))


register_format(MemmapFormat)
