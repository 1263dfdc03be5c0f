"""Lance: a columnar dataset with fast random ``take``, read by ``pylance``, LanceDB, DuckDB, polars.

On disk the output directory *is* the Lance dataset, with pickleshard's two files beside Lance's::

    OUT/_versions/, OUT/data/*.lance, OUT/_transactions/   Lance's own (``lance.dataset(OUT)``)
    OUT/pickleshard.json    descriptor: "lance_rows" (rows per write batch), and per field
                            {"name", "column", "type", "arrow_type", ["codec": "pickle"],
                            ["shape_column"]}
    OUT/hashes.npy          uint8 (N, 16) content digests (see pickleshard.formats.base)

Row ``i`` of the dataset is sample ``i``. The columns are the Parquet format's
(:mod:`pickleshard.formats.arrow.format`, same column types: :mod:`~.arrow.columntypes`):
arrays of one shape as Arrow's fixed-shape tensors (``arrow.fixed_shape_tensor``, stored as one
``fixed_size_list`` of the elements in C order: ``take(...).column(f).chunk(0).to_numpy_ndarray()``
gives ``(n, *shape)``, ``lance.torch.data.LanceDataset`` a ``(batch, size)`` tensor; bool arrays,
which Arrow tensors cannot hold, as Parquet's nested ``fixed_size_list``), arrays of varying shape as a ``large_list`` of their elements in C order plus a
``<field>_shape`` column (Lance reads a dot in a column name as a path into a struct, so dots
in field names become ``_`` in column names too), Python scalars, str, bytes, lists and str-keyed dicts as themselves,
and anything Arrow cannot express as a ``large_binary`` column of pickles (protocol 5, loaded
under the reader's restricted unpickling policy; the field entry says ``"codec": "pickle"``). The field entries are
also in the schema's metadata under ``b"pickleshard"``.

Writing: the parts are memmap's column segments, written in parallel; finalizing streams them,
a batch of about 1 MiB of every field at a time, into one ``lance.write_dataset`` call
(Lance buffers at most 1 MiB of each column before it writes a page; measured, its writer and
library still hold 50-90 MiB more than the Parquet path's, see docs/formats.md). Lance names its data files
by random ids, stamps its manifest with the time and writes field metadata in hash order: the
same conversion run twice gives the same rows, schema and metadata, not the same bytes.

Reading (:class:`LanceTableDataset`): one ``take`` per batch of indices, then each field's values
from its Arrow column. Each process opens the dataset for itself. Needs
``pip install 'pickleshard[lance]'`` (pylance).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import MissingDependencyError
from ..io.handles import ProcessLocal
from ..safety import DEFAULT_POLICY, UnpicklePolicy
from .arrow.columntypes import ColumnType, arrow_type, numpy_dtype
from .arrow.values import from_arrow, is_stacked, rows_of_view, stacked_view
from .arrow.write import METADATA_KEY, TablePartWriter, table_batches
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
from .encoding import MemberKind, decode_member
from .registry import register_format

__all__ = ["LanceFormat", "LanceTableDataset", "import_lance", "lance_type"]

_PAGE_BUFFER_BYTES = 1 << 20


def import_lance() -> ModuleType:
    """The ``lance`` module, or :class:`MissingDependencyError` with the install hint."""
    try:
        import lance
    except ImportError:
        raise MissingDependencyError("pylance", "lance", "the Lance format") from None
    return lance


class LanceFormat(Format):
    """The Lance format (module docstring)."""

    name = "lance"

    def __init__(self) -> None:
        # Found, not imported: the parts are written in forked processes, and importing lance
        # makes every fork warn that lance is not fork-safe (the parts never touch lance).
        if importlib.util.find_spec("lance") is None:
            raise MissingDependencyError("pylance", "lance", "the Lance format")

    def part_writer(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> PartWriter:
        return TablePartWriter(part_dir, spec, options)

    def finalize(
        self, staging: Path, parts: Sequence[PartResult], options: WriteOptions
    ) -> dict[str, Any]:
        import pyarrow as pa

        lance = import_lance()
        schema, entries, rows, batches = table_batches(parts, options, None, sep="_")
        tensors = {e["column"]: lance_type(e["type"]) for e in entries if _is_tensor(e["type"])}
        for e in entries:
            e["arrow_type"] = str(lance_type(e["type"]))
        schema = pa.schema(
            [schema.field(c).with_type(tensors.get(c, schema.field(c).type)) for c in schema.names],
            metadata=schema.metadata,
        )
        reader = pa.RecordBatchReader.from_batches(
            schema, (_with_tensors(b, schema, tensors) for b in batches)
        )
        # The staging directory becomes the dataset's root: Lance writes _versions/, data/ and
        # _transactions/ beside the parts, which clear_outputs removes if this is interrupted.
        # 1 MiB of page buffer per column instead of Lance's 8 MiB: less held while writing,
        # pages still large enough that a take reads few of them
        cache = _PAGE_BUFFER_BYTES * max(1, len(schema.names))
        lance.write_dataset(reader, str(staging), mode="create", data_cache_bytes=cache)
        return {"fields": entries, "lance_rows": rows}

    def open(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions
    ) -> ConvertedDataset:
        return LanceTableDataset(root, descriptor, options.policy)


def _is_tensor(ct: ColumnType | None) -> bool:
    """Arrays of one shape, but not of bools: Arrow's tensors hold numbers only."""
    return (
        ct is not None and ct["t"] == "array" and bool(ct["shape"]) and numpy_dtype(ct).kind != "b"
    )


def lance_type(ct: ColumnType | None) -> Any:
    """The Arrow type of a field's column in Lance: Parquet's, but a fixed-shape tensor for
    arrays of one shape."""
    import pyarrow as pa

    if ct is not None and _is_tensor(ct):
        prim = pa.from_numpy_dtype(numpy_dtype(ct).newbyteorder("="))
        return pa.fixed_shape_tensor(prim, ct["shape"])
    return arrow_type(ct)


def _with_tensors(batch: Any, schema: Any, tensors: dict[str, Any]) -> Any:
    """``batch`` with its nested ``fixed_size_list`` columns of arrays as tensor columns: one
    ``fixed_size_list`` of the elements (the same buffers, no copy) under the tensor type."""
    import pyarrow as pa

    columns = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        tt = tensors.get(name)
        if tt is not None:
            flat = col
            for _ in tt.shape:
                flat = flat.flatten()
            storage = pa.FixedSizeListArray.from_arrays(flat, tt.storage_type.list_size)
            col = pa.ExtensionArray.from_storage(tt, storage)
        columns.append(col)
    return pa.record_batch(columns, schema=schema)


def _tensor_view(ct: ColumnType, arr: Any) -> np.ndarray[Any, Any]:
    """A tensor column's rows as one ndarray ``(n, *shape)`` (a view where pyarrow allows)."""
    if arr.null_count:
        raise ValueError("an array column holds nulls")
    flat = arr.storage.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat).reshape(len(arr), *ct["shape"])


_USED_IN: int | None = None  # the process that used Lance here (a forked child inherits it)


class LanceTableDataset(ConvertedDataset):
    """Reads a Lance conversion (module docstring): ``__getitems__`` is one ``take``."""

    def __init__(
        self, root: Path, descriptor: dict[str, Any], policy: UnpicklePolicy = DEFAULT_POLICY
    ) -> None:
        super().__init__(root, descriptor, policy)
        self._entries: list[dict[str, Any]] = descriptor["fields"]
        self._columns: list[list[str]] = []
        self._lance = ProcessLocal(self._open)  # each process opens (and checks) its own
        self._lance.get()

    def _open(self) -> Any:
        global _USED_IN
        if _USED_IN is not None and os.getpid() != _USED_IN:
            # a fork of a process that used Lance: its runtime's threads did not come along, and
            # a read would wait for them forever
            raise self._corrupt(
                "Lance cannot be read in a process forked after it was used (its runtime is not "
                "fork-safe): give the DataLoader multiprocessing_context='spawn' (or "
                "'forkserver'), or convert to memmap for fork-started workers"
            )
        lance = import_lance()
        _USED_IN = os.getpid()
        try:
            ds = lance.dataset(str(self.root))
            schema, rows = ds.schema, ds.count_rows()
        except (OSError, ValueError, RuntimeError) as exc:
            raise self._corrupt(f"cannot open the Lance dataset: {exc}") from None
        try:
            self._check_schema(schema, rows)
        except (KeyError, TypeError) as exc:
            raise self._corrupt(f"the descriptor's field entries are damaged: {exc!r}") from None
        return ds

    def _check_schema(self, schema: Any, rows: int) -> None:
        names = schema.names
        columns = []
        for e in self._entries:
            cols = [e["column"]] + ([e["shape_column"]] if "shape_column" in e else [])
            if any(c not in names for c in cols):
                raise self._corrupt(f"the Lance dataset has no column {cols!r}")
            have, want = schema.field(cols[0]).type, lance_type(e["type"])
            if have != want:
                raise self._corrupt(
                    f"column {cols[0]!r} of the Lance dataset holds {have}, the descriptor "
                    f"says {want}"
                )
            columns.append(cols)
        if rows != len(self):
            raise self._corrupt(f"the Lance dataset holds {rows} rows, expected {len(self)}")
        if schema.metadata is None or METADATA_KEY not in schema.metadata:
            raise self._corrupt("the Lance dataset carries no pickleshard schema metadata")
        self._columns = columns

    def _get(self, i: int) -> Sample:
        return self._get_many(np.array([i], dtype=np.int64))[0]

    def _get_many(self, idx: np.ndarray[Any, Any]) -> list[Sample]:
        if not len(idx):
            return []
        import pyarrow as pa

        ds = self._lance.get()
        wanted = [c for cols in self._columns for c in cols]
        try:
            table = ds.take(idx, columns=wanted)
        except (OSError, ValueError, RuntimeError) as exc:
            raise self._corrupt(f"cannot take rows: {exc}", int(idx[0])) from None
        rows = np.arange(len(idx))
        values = []
        for e, cols in zip(self._entries, self._columns, strict=True):
            ct = e["type"]
            arrays = [table.column(c).combine_chunks() for c in cols]
            try:
                if _is_tensor(ct):
                    values.append(rows_of_view(ct, _tensor_view(ct, arrays[0]), rows))
                elif ct is not None and is_stacked(ct):
                    values.append(rows_of_view(ct, stacked_view(ct, arrays[0]), rows))
                else:
                    unpickle = partial(self._unpickle, int(idx[0]))
                    values.append(from_arrow(ct, arrays, unpickle))
            except (ValueError, TypeError, pa.ArrowException) as exc:
                raise self._corrupt(
                    f"cannot decode field {e['name']!r}: {exc}", int(idx[0])
                ) from None
        return list(zip(*values, strict=True))

    def _unpickle(self, sample: int, data: bytes) -> Any:
        where = os.fspath(self.root)
        return decode_member(MemberKind.PICKLE, data, self.policy, where, sample)

    def __reduce__(self) -> tuple[Any, ...]:
        return (LanceTableDataset, (self.root, self.descriptor, self.policy))


register_format(LanceFormat)
