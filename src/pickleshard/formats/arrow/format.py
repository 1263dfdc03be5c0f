"""Parquet and Arrow IPC: the formats HF ``datasets``, polars, DuckDB and Spark read as they are.

On disk::

    OUT/data.parquet        (``--to parquet``) one Parquet file, row groups of row_group_rows
    OUT/data.arrow          (``--to arrow``) one Arrow IPC *stream* file, one record batch per
                            row group: what ``datasets.Dataset.from_file`` memory-maps
    OUT/pickleshard.json    descriptor: "file", "row_group_rows", "row_groups", and per field
                            {"name", "column", "type", "arrow_type", ["codec": "pickle"],
                            ["shape_column"]}
    OUT/hashes.npy          uint8 (N, 16) content digests (see pickleshard.formats.base)

Row ``i`` of the table is sample ``i``; each field is one column named after it, of the native
Arrow type its values have (:mod:`pickleshard.formats.arrow.columntypes`): Python scalars, str and
bytes as themselves, lists and str-keyed dicts as lists and structs, numpy arrays of one shape
as nested ``fixed_size_list`` (``datasets``' ``with_format("numpy")`` gives the ndarray back),
arrays of varying shape as a ``large_list`` of their elements in C order plus a
``<field>.shape`` column. A field Arrow cannot express is a ``large_binary`` column of pickles
(protocol 5, ``pickle.loads``; the descriptor entry says ``"codec": "pickle"``; pickleshard
loads them under the reader's restricted unpickling policy). The same field
entries are in the file's schema metadata under ``b"pickleshard"``, so the file describes
itself. Parquet columns are uncompressed by default (``compression=`` takes any codec pyarrow
writes) and dictionary-encoded only for strings, so a random read costs no decompression.

``row_group_rows`` (default: about 1 MiB of data per group, at most 65,536 rows) sets the
granularity of random access: reading one Parquet sample decodes its whole row group.
Needs ``pip install 'pickleshard[parquet]'`` (pyarrow).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from ...errors import MissingDependencyError
from ..base import (
    ConvertedDataset,
    Format,
    PartResult,
    PartSpec,
    PartWriter,
    ReadOptions,
    WriteOptions,
)
from ..registry import register_format
from .read import TableDataset
from .write import TablePartWriter, write_table_file

__all__ = ["ArrowFormat", "ParquetFormat", "import_pyarrow", "with_row_group_rows"]


def import_pyarrow() -> ModuleType:
    """The ``pyarrow`` module, or :class:`MissingDependencyError` with the install hint."""
    try:
        import pyarrow
    except ImportError:
        raise MissingDependencyError(
            "pyarrow", "parquet", "the Parquet and Arrow formats"
        ) from None
    return pyarrow  # type: ignore[no-any-return]  # mypy sees pyarrow untyped (ignore_missing_imports)


class _TableFormat(Format):
    """What Parquet and Arrow share: part writer, finalize into one file, reader."""

    file_name: ClassVar[str]

    def __init__(self, row_group_rows: int | None = None) -> None:
        if row_group_rows is not None and (
            not isinstance(row_group_rows, int) or row_group_rows < 1
        ):
            raise ValueError(f"row_group_rows must be an int >= 1, got {row_group_rows!r}")
        self.row_group_rows = row_group_rows
        import_pyarrow()

    def options_key(self) -> dict[str, Any]:
        return {"row_group_rows": self.row_group_rows}

    def part_writer(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> PartWriter:
        return TablePartWriter(part_dir, spec, options)

    def finalize(
        self, staging: Path, parts: Sequence[PartResult], options: WriteOptions
    ) -> dict[str, Any]:
        return write_table_file(
            staging, self.file_name, parts, options, self._sink, self.row_group_rows
        )

    def _sink(self, path: Path, schema: Any, dictionary: Sequence[str]) -> Any:
        raise NotImplementedError

    def open(
        self, root: Path, descriptor: dict[str, Any], options: ReadOptions
    ) -> ConvertedDataset:
        return TableDataset(root, descriptor, options.policy)


class _ParquetSink:
    def __init__(
        self, path: Path, schema: Any, dictionary: Sequence[str], compression: str
    ) -> None:
        import pyarrow.parquet as pq

        self.writer = pq.ParquetWriter(
            path, schema, compression=compression, use_dictionary=list(dictionary) or False
        )

    def write_batch(self, batch: Any, rows: int) -> None:
        self.writer.write_batch(batch, row_group_size=rows)

    def close(self) -> None:
        self.writer.close()


class _StreamSink:
    def __init__(self, path: Path, schema: Any) -> None:
        pa = import_pyarrow()
        self.file = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.file, schema)

    def write_batch(self, batch: Any, rows: int) -> None:
        self.writer.write_batch(batch)

    def close(self) -> None:
        self.writer.close()
        self.file.close()


class ParquetFormat(_TableFormat):
    """The Parquet format (module docstring); ``compression`` is pyarrow's codec name."""

    name = "parquet"
    file_name = "data.parquet"

    def __init__(self, row_group_rows: int | None = None, compression: str = "none") -> None:
        super().__init__(row_group_rows)
        self.compression = compression

    def options_key(self) -> dict[str, Any]:
        return {**super().options_key(), "compression": self.compression}

    def _sink(self, path: Path, schema: Any, dictionary: Sequence[str]) -> Any:
        return _ParquetSink(path, schema, dictionary, self.compression)


class ArrowFormat(_TableFormat):
    """The Arrow IPC stream format (module docstring)."""

    name = "arrow"
    file_name = "data.arrow"

    def _sink(self, path: Path, schema: Any, dictionary: Sequence[str]) -> Any:
        return _StreamSink(path, schema)


def with_row_group_rows(fmt: Format, rows: int) -> Format:
    """A copy of ``fmt`` (Parquet or Arrow) writing row groups of ``rows`` rows.

    Raises ``ValueError`` for another format, which has no row groups.
    """
    if not isinstance(fmt, _TableFormat):
        raise ValueError(
            f"row_group_rows applies to the parquet and arrow formats, not {fmt.name!r}"
        )
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"row_group_rows must be an int >= 1, got {rows!r}")
    out = copy.copy(fmt)
    out.row_group_rows = rows
    return out


register_format(ParquetFormat)
register_format(ArrowFormat)
