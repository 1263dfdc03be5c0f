"""Writing the Arrow and Parquet formats: typed part columns, then one streamed table file.

A part is written as memmap's column segments (:class:`~pickleshard.formats.columns.ColumnWriter`:
raw array and scalar bytes, safely encoded objects) while each field's column type
(:mod:`.arrow_types`) is folded over its values; the part's summary records both. Finalizing
merges the parts' column types into one per field, which fixes the table's schema, then streams
every field's values part by part, in row groups of ``row_group_rows`` rows, into one file
through a :class:`TableSink` (``data.parquet`` or ``data.arrow``), written under a temporary
name and renamed. Arrays whose segment already has the field's dtype and shape are read as raw
blocks (no per-sample work); other values are decoded from their segment one by one.

Memory: one row group of every field (``row_group_rows`` samples) plus read buffers of
:data:`~pickleshard.formats.files.COPY_CHUNK` bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...io.atomic import atomic_path
from ..base import PartResult, PartSpec, PartWriter, Sample, WriteOptions
from ..columns import ColumnWriter, iter_segment
from ..files import iter_raw_chunks
from .columntypes import ColumnType, arrow_type, infer_type, merge_types, numpy_dtype
from .values import Chunk, is_stacked, stack_values, to_arrow

__all__ = [
    "DEFAULT_ROW_GROUP_BYTES",
    "MAX_AUTO_ROWS",
    "METADATA_KEY",
    "TablePartWriter",
    "TableSink",
    "auto_row_group_rows",
    "table_batches",
    "write_table_file",
]

#: the schema metadata key under which the file carries its field entries (as the descriptor)
METADATA_KEY = b"pickleshard"
#: the row-group size ``row_group_rows=None`` aims at: a random read decodes one row group
DEFAULT_ROW_GROUP_BYTES = 1 << 20
MAX_AUTO_ROWS = 65536
_PYTHON_BYTES = {"int": 8, "float": 8, "bool": 1}

TableSink = Callable[[Path, Any, Sequence[str]], Any]
"""``sink(path, schema, dictionary_columns)`` -> an object with ``write_batch(batch, rows)`` and
``close()``, writing the table file at ``path``."""


class TablePartWriter(PartWriter):
    """memmap's column segments plus each field's column type (module docstring)."""

    def __init__(self, part_dir: Path, spec: PartSpec, options: WriteOptions) -> None:
        super().__init__(part_dir, spec, options)
        self.columns = [ColumnWriter(part_dir, k) for k in range(len(options.fields))]
        self.types: list[ColumnType | None] = [None] * len(options.fields)

    def write(self, index: int, sample: Sample) -> None:
        for k, (column, value) in enumerate(zip(self.columns, sample, strict=True)):
            column.append(value)
            self.types[k] = merge_types(self.types[k], infer_type(value))

    def close(self) -> dict[str, Any]:
        segments = [c.close() for c in self.columns]
        nbytes = sum(s["nbytes"] for field in segments for s in field)
        return {
            "segments": segments,
            "types": self.types,
            "count": self.spec.count,
            "bytes": nbytes,
        }


def auto_row_group_rows(parts: Sequence[PartResult]) -> int:
    """Rows per row group for about :data:`DEFAULT_ROW_GROUP_BYTES` of stored data each."""
    count = sum(int(p.summary["count"]) for p in parts)
    nbytes = sum(int(p.summary["bytes"]) for p in parts)
    per_row = max(1, nbytes // max(1, count))
    return int(np.clip(DEFAULT_ROW_GROUP_BYTES // per_row, 1, MAX_AUTO_ROWS))


def _column_names(
    fields: Sequence[str], types: Sequence[ColumnType | None], sep: str
) -> list[list[str]]:
    """Per field its column name(s): the field's name, and ``<name><sep>shape`` for a ragged
    one; with ``sep`` other than ``"."``, dots in names become ``sep`` (Lance reads a dot as a
    path into a struct)."""
    taken: set[str] = set()
    out = []
    for name, ct in zip(fields, types, strict=True):
        stem = str(name) if sep == "." else str(name).replace(".", sep)
        ragged = ct is not None and ct["t"] == "ragged"
        wanted = [stem] + ([f"{stem}{sep}shape"] if ragged else [])
        cols = []
        for col in wanted:
            base, n = col, 1
            while col in taken:
                col, n = f"{base}_{n}", n + 1
            taken.add(col)
            cols.append(col)
        out.append(cols)
    return out


def field_entries(
    options: WriteOptions, parts: Sequence[PartResult], sep: str = "."
) -> list[dict[str, Any]]:
    """One descriptor entry per field: name, column(s), column type, Arrow type, codec
    (``sep``: see :func:`_column_names`)."""
    types: list[ColumnType | None] = []
    for k in range(len(options.fields)):
        ct: ColumnType | None = None
        for part in parts:
            pt = part.summary["types"][k]
            if pt is not None:
                ct = merge_types(ct, pt)
        types.append(ct)
    entries = []
    for name, ct, cols in zip(
        options.fields, types, _column_names(options.fields, types, sep), strict=True
    ):
        entry: dict[str, Any] = {"name": name, "column": cols[0], "type": ct}
        entry["arrow_type"] = str(arrow_type(ct))
        if ct is None or ct["t"] == "pickle":
            entry["codec"] = "pickle"
        if len(cols) > 1:
            entry["shape_column"] = cols[1]
        entries.append(entry)
    return entries


def _segment_pieces(
    ct: ColumnType | None, base: Path, seg: dict[str, Any], rows: int
) -> Iterator[Chunk]:
    """One segment's values as chunks: raw blocks where the bytes are already right, else lists
    of at most ``rows`` values (so no more than a row group of decoded values is held)."""
    if ct is not None and is_stacked(ct):
        t = ct["t"]
        if t == "array" and seg["kind"] == "array" and seg["shape"] == ct["shape"]:
            if seg["dtype"] == ct["dtype"]:
                yield from _raw_rows(base, numpy_dtype(ct), ct["shape"], seg["count"])
                return
        elif seg["kind"] == t and (t != "scalar" or seg["dtype"] == ct["dtype"]):
            dtype = numpy_dtype(ct) if t == "scalar" else np.dtype(_np_leaf(t))
            yield from iter_raw_chunks(Path(f"{base}.data"), dtype)
            return
    values: list[Any] = []
    for v in iter_segment(base, seg):
        values.append(v)
        if len(values) >= rows:
            yield values
            values = []
    if values:
        yield values


def _np_leaf(t: str) -> Any:
    return {"int": np.int64, "float": np.float64, "bool": np.bool_}[t]


def _raw_rows(
    base: Path, dtype: np.dtype[Any], shape: list[int], count: int
) -> Iterator[np.ndarray[Any, Any]]:
    width = int(np.prod(shape, dtype=np.int64))
    if width == 0 or not shape:
        if not shape:
            yield from iter_raw_chunks(Path(f"{base}.data"), dtype)
        else:
            yield np.empty((count, *shape), dtype=dtype)
        return
    for block in iter_raw_chunks(Path(f"{base}.data"), dtype, width):
        yield block.reshape(-1, *shape)


def _field_chunks(
    ct: ColumnType | None, k: int, parts: Sequence[PartResult], rows: int
) -> Iterator[list[Any]]:
    """Field ``k``'s values over every part, as the Arrow array(s) of ``rows`` rows at a time."""
    stacked = ct is not None and is_stacked(ct)
    held: list[Chunk] = []
    count = 0

    def take(n: int) -> Chunk:
        nonlocal held, count
        if stacked:
            blocks = [b if isinstance(b, np.ndarray) else stack_values(ct, b) for b in held]  # type: ignore[arg-type]
            joined: Any = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        else:
            joined = [v for piece in held for v in piece]
        out, rest = joined[:n], joined[n:]
        held, count = ([rest] if len(rest) else []), len(rest)
        return out  # type: ignore[no-any-return]

    for part in parts:
        for s, seg in enumerate(part.summary["segments"][k]):
            for piece in _segment_pieces(ct, part.dir / f"c{k}.{s}", seg, rows):
                held.append(piece)
                count += len(piece)
                while count >= rows:
                    yield to_arrow(ct, take(rows))
    if count:
        yield to_arrow(ct, take(count))


def table_batches(
    parts: Sequence[PartResult],
    options: WriteOptions,
    row_group_rows: int | None,
    sep: str = ".",
) -> tuple[Any, list[dict[str, Any]], int, Iterator[Any]]:
    """The table of the parts as ``(schema, field entries, rows, record batches)``: batches of
    ``rows`` rows, streamed from the parts (one batch of every field held at a time); ``sep``
    joins a ragged field's name to ``shape`` (see :func:`_column_names`)."""
    import pyarrow as pa

    entries = field_entries(options, parts, sep)
    rows = row_group_rows if row_group_rows is not None else auto_row_group_rows(parts)
    schema_fields = []
    for e in entries:
        ct = e["type"]
        schema_fields.append(pa.field(e["column"], arrow_type(ct), nullable=True))
        if "shape_column" in e:
            schema_fields.append(pa.field(e["shape_column"], pa.list_(pa.int64(), ct["ndim"])))
    meta = {"format": "pickleshard", "version": 1, "fields": entries}
    schema = pa.schema(schema_fields, metadata={METADATA_KEY: json.dumps(meta).encode()})

    def batches() -> Iterator[Any]:
        streams = [_field_chunks(e["type"], k, parts, rows) for k, e in enumerate(entries)]
        for arrays in zip(*streams, strict=True):
            columns = [a for field in arrays for a in field]
            yield pa.record_batch(columns, schema=schema)

    return schema, entries, rows, batches()


def write_table_file(
    staging: Path,
    name: str,
    parts: Sequence[PartResult],
    options: WriteOptions,
    sink: TableSink,
    row_group_rows: int | None,
) -> dict[str, Any]:
    """Write ``staging/name`` from the parts; return the format's descriptor entries."""
    schema, entries, rows, batches = table_batches(parts, options, row_group_rows)
    dictionary = [e["column"] for e in entries if e["type"] is not None and e["type"]["t"] == "str"]
    groups = 0
    with atomic_path(staging / name) as tmp:
        writer = sink(tmp, schema, dictionary)
        for batch in batches:
            writer.write_batch(batch, rows)
            groups += 1
        writer.close()
    return {
        "fields": entries,
        "file": name,
        "row_group_rows": rows,
        "row_groups": groups,
    }
