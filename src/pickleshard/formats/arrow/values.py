"""Values to Arrow arrays and back, for one field of a given column type (:mod:`.arrow_types`).

:func:`to_arrow` turns a chunk of one field's values (a list, or for the numpy-backed column
types a stacked ndarray) into its Arrow array(s); :func:`from_arrow` turns Arrow arrays back into
the values as the source held them: Python ints/floats/bools/str/bytes/lists/dicts, numpy scalars
and arrays with their original dtype (byte order included) and shape, writable copies, and the
unpickled value (through the caller's restricted ``load``) for the fallback column.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..pickled import pickle_value
from .columntypes import ColumnType, arrow_type, numpy_dtype

__all__ = ["from_arrow", "is_stacked", "rows_of_view", "stack_values", "stacked_view", "to_arrow"]

Chunk = list[Any] | np.ndarray[Any, Any]

_STACKED_LEAVES = {"int": np.int64, "float": np.float64, "bool": np.bool_}


def is_stacked(ct: ColumnType) -> bool:
    """Whether chunks of this column type travel as one stacked ndarray (else as a list)."""
    t = ct["t"]
    return t in ("array", "scalar") or (t in _STACKED_LEAVES and not ct["null"])


def stack_values(ct: ColumnType, values: list[Any]) -> np.ndarray[Any, Any]:
    """``values`` of a stacked column type as one ndarray: ``(n, *shape)`` or ``(n,)``."""
    t = ct["t"]
    if t == "array":
        return np.array(values, dtype=numpy_dtype(ct)).reshape(len(values), *ct["shape"])
    dtype = numpy_dtype(ct) if t == "scalar" else np.dtype(_STACKED_LEAVES[t])
    return np.array(values, dtype=dtype).reshape(len(values))


def _native(arr: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """C-ordered, native byte order (Arrow's), flattened."""
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("=")).reshape(-1)


def to_arrow(ct: ColumnType | None, chunk: Chunk) -> list[Any]:
    """The Arrow array(s) of one chunk: one array, or for ``ragged`` the values and the shapes."""
    import pyarrow as pa

    if ct is None or ct["t"] == "pickle":
        blobs = [pickle_value(v) for v in chunk]
        return [pa.array(blobs, type=pa.large_binary())]
    t = ct["t"]
    if t == "array":
        assert isinstance(chunk, np.ndarray)
        out = pa.array(_native(chunk))
        for n in reversed(ct["shape"]):
            out = pa.FixedSizeListArray.from_arrays(out, int(n))
        return [out]
    if t == "ragged":
        sizes = np.array([v.size for v in chunk], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.concatenate([_native(v) for v in chunk]) if len(chunk) else np.empty(0)
        values = pa.array(flat.astype(numpy_dtype(ct).newbyteorder("="), copy=False))
        shapes = np.array([v.shape for v in chunk], dtype=np.int64).reshape(-1)
        return [
            pa.LargeListArray.from_arrays(pa.array(offsets), values),
            pa.FixedSizeListArray.from_arrays(pa.array(shapes, pa.int64()), int(ct["ndim"])),
        ]
    if isinstance(chunk, np.ndarray):
        return [pa.array(_native(chunk), type=arrow_type(ct))]
    return [pa.array(chunk, type=arrow_type(ct))]


def _flat_numpy(arr: Any, depth: int) -> np.ndarray[Any, Any]:
    """The primitive values under ``depth`` levels of (fixed-size) lists, as numpy."""
    for _ in range(depth):
        arr = arr.flatten()
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def from_arrow(
    ct: ColumnType | None, arrays: list[Any], unpickle: Callable[[bytes], Any]
) -> list[Any]:
    """The values of a chunk's Arrow array(s) (as :func:`to_arrow` made them), in row order;
    ``unpickle`` loads the fallback column's pickles (the reader's restricted load).

    Raises ``ValueError`` for arrays that do not hold what the column type says.
    """
    arr = arrays[0]
    if ct is None or ct["t"] == "pickle":
        return [unpickle(b) for b in arr.to_pylist()]
    t = ct["t"]
    n = len(arr)
    if t in ("array", "scalar"):
        dtype = numpy_dtype(ct)
        shape = ct.get("shape", [])
        if arr.null_count:
            raise ValueError(f"a {t} column holds nulls")
        block = np.array(_flat_numpy(arr, len(shape)), dtype=dtype).reshape(n, *shape)
        if t == "scalar":
            return [block[k] for k in range(n)]
        return [block[k, ...] for k in range(n)] if not shape else list(block)
    if t == "ragged":
        return _ragged(ct, arr, arrays[1])
    return list(arr.to_pylist())


def stacked_view(ct: ColumnType, arr: Any) -> np.ndarray[Any, Any]:
    """A stacked column's rows as one ndarray ``(n, *shape)`` in Arrow's (native) byte order:
    a view of the Arrow buffers where pyarrow allows (numbers without nulls), else a copy."""
    if arr.null_count:
        raise ValueError(f"a {ct['t']} column holds nulls")
    shape = ct.get("shape", []) if ct["t"] == "array" else []
    return _flat_numpy(arr, len(shape)).reshape(len(arr), *shape)


def rows_of_view(
    ct: ColumnType, view: np.ndarray[Any, Any], local: np.ndarray[Any, Any]
) -> list[Any]:
    """The values of rows ``local`` of a :func:`stacked_view`, as :func:`from_arrow` gives them."""
    t = ct["t"]
    if t in _STACKED_LEAVES:
        return list(view[local].tolist())
    block = np.array(view[local], dtype=numpy_dtype(ct))  # a copy, in the original byte order
    if t == "scalar":
        return [block[k] for k in range(len(block))]
    return [block[k, ...] for k in range(len(block))] if block.ndim == 1 else list(block)


def _ragged(ct: ColumnType, arr: Any, shapes_arr: Any) -> list[Any]:
    dtype = numpy_dtype(ct)
    ndim = int(ct["ndim"])
    offsets = np.asarray(arr.offsets.to_numpy(), dtype=np.int64)
    offsets = offsets - offsets[0]
    values = np.array(_flat_numpy(arr, 1), dtype=dtype)
    shapes = _flat_numpy(shapes_arr, 1).astype(np.int64).reshape(len(arr), ndim)
    out = []
    for k in range(len(arr)):
        a, b = int(offsets[k]), int(offsets[k + 1])
        shape = tuple(shapes[k].tolist())
        if int(np.prod(shape, dtype=np.int64)) != b - a or min(shape, default=0) < 0:
            raise ValueError(f"row {k} has {b - a} values but shape {shape}")
        out.append(values[a:b].reshape(shape))
    return out
