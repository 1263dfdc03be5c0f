"""Reading the Arrow and Parquet formats: random access by row group, batches by ``__getitems__``.

:class:`TableDataset` maps a sample index to its row group (the descriptor's
``row_group_rows``; every group but the last is full), reads that group's columns and turns the
wanted rows back into values (:func:`~pickleshard.formats.arrow.values.from_arrow`). A batch
reads each row group it touches once.

- ``data.arrow`` (Arrow IPC stream) is memory-mapped: its record batches are views of the
  mapping, so a read copies only the rows it returns; nothing is cached.
- ``data.parquet`` is memory-mapped too, but a row group must be decoded whole: decoded groups
  are kept in a :class:`RowGroupCache` of at most ``cache_bytes`` (LRU; ``hits`` and ``misses``
  count lookups), so a sequential read decodes each group once.

Each process opens the file for itself (DataLoader workers after fork, or unpickled copies).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConvertedDatasetError
from ...io.handles import ProcessLocal
from ...safety import DEFAULT_POLICY, UnpicklePolicy
from ..base import ConvertedDataset, Sample
from ..encoding import MemberKind, decode_member
from .columntypes import arrow_type
from .values import from_arrow, is_stacked, rows_of_view, stacked_view
from .write import METADATA_KEY

__all__ = ["DEFAULT_CACHE_BYTES", "RowGroupCache", "TableDataset"]

#: decoded Parquet row groups kept per process
DEFAULT_CACHE_BYTES = 64 << 20


class RowGroupCache:
    """Decoded row groups, least recently used dropped first, holding at most ``budget`` bytes
    (a group bigger than the budget is returned but not kept)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self.hits = 0
        self.misses = 0
        self._groups: OrderedDict[int, tuple[list[Any], int]] = OrderedDict()

    def __contains__(self, k: int) -> bool:
        return k in self._groups

    def get(self, k: int) -> list[Any] | None:
        found = self._groups.get(k)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._groups.move_to_end(k)
        return found[0]

    def put(self, k: int, columns: list[Any], nbytes: int) -> None:
        if nbytes > self.budget:
            return
        self._groups[k] = (columns, nbytes)
        self.held += nbytes
        while self.held > self.budget:
            _, (_, dropped) = self._groups.popitem(last=False)
            self.held -= dropped


class _Group:
    """One row group: its Arrow columns, and per stacked field a numpy view made on first use."""

    def __init__(self, columns: list[Any]) -> None:
        self.columns = columns
        self.views: dict[int, np.ndarray[Any, Any]] = {}


class _OpenTable:
    """One process's view of the file: the Parquet file (or the Arrow stream's record batches,
    views of its mapping), its row-group cache and the groups made so far."""

    def __init__(self, file: Any, batches: list[Any], cache_bytes: int) -> None:
        self.file, self.batches = file, batches
        self.cache = RowGroupCache(cache_bytes)
        self.groups: dict[int, _Group] = {}


class TableDataset(ConvertedDataset):
    """Reads a Parquet or Arrow conversion (module docstring)."""

    def __init__(
        self,
        root: Path,
        descriptor: dict[str, Any],
        policy: UnpicklePolicy = DEFAULT_POLICY,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        super().__init__(root, descriptor, policy)
        self.cache_bytes = cache_bytes
        self.path = root / str(descriptor.get("file", ""))
        self.parquet = self.path.suffix == ".parquet"
        self.rows = max(1, int(descriptor.get("row_group_rows", 1)))
        self._entries: list[dict[str, Any]] = descriptor["fields"]
        self._table = ProcessLocal(self._open)  # each process opens (and checks) its own
        self._table.get()

    # ---- opening ------------------------------------------------------------------------------

    def _open(self) -> _OpenTable:
        import pyarrow as pa

        try:
            if self.parquet:
                import pyarrow.parquet as pq

                file: Any = pq.ParquetFile(self.path, memory_map=True)
                schema = file.schema_arrow
                sizes = [file.metadata.row_group(k).num_rows for k in range(file.num_row_groups)]
                batches: list[Any] = []
            else:
                file = pa.ipc.open_stream(pa.memory_map(os.fspath(self.path)))
                schema = file.schema
                batches = list(file)
                sizes = [b.num_rows for b in batches]
        except (OSError, pa.ArrowException) as exc:
            raise self._corrupt(f"cannot open {self.path.name}: {exc}") from None
        try:
            self._check_file(schema, sizes)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConvertedDatasetError):
                raise
            raise self._corrupt(f"the descriptor's field entries are damaged: {exc!r}") from None
        return _OpenTable(file, batches, self.cache_bytes)

    def _check_file(self, schema: Any, sizes: list[int]) -> None:
        names = schema.names
        self._columns: list[list[int]] = []
        for e in self._entries:
            cols = [e["column"]] + ([e["shape_column"]] if "shape_column" in e else [])
            if any(c not in names for c in cols):
                raise self._corrupt(f"{self.path.name} has no column {cols!r}")
            self._columns.append([names.index(c) for c in cols])
            have, want = schema.field(cols[0]).type, arrow_type(e["type"])
            if have != want:
                raise self._corrupt(
                    f"column {cols[0]!r} of {self.path.name} holds {have}, the descriptor says "
                    f"{want}"
                )
        n = len(self)
        want = [self.rows] * (n // self.rows) + ([n % self.rows] if n % self.rows else [])
        if sizes != want:
            raise self._corrupt(
                f"{self.path.name} holds row groups of {sizes[:4]}... rows ({sum(sizes)} in all), "
                f"expected {len(want)} groups of {self.rows} ({n} in all)"
            )
        if schema.metadata is None or METADATA_KEY not in schema.metadata:
            raise self._corrupt(f"{self.path.name} carries no pickleshard schema metadata")

    def _group(self, k: int) -> _Group:
        """Row group ``k``: its columns as Arrow arrays."""
        table = self._table.get()
        if not self.parquet:
            group = table.groups.get(k)
            if group is None:  # views of the mapping: nothing is copied, nothing to bound
                group = table.groups[k] = _Group(list(table.batches[k].columns))
            return group
        found = table.cache.get(k)
        if found is None:
            import pyarrow as pa

            try:
                read = table.file.read_row_group(k, use_threads=False)
            except (OSError, pa.ArrowException) as exc:
                raise self._corrupt(f"cannot read row group {k}: {exc}", k * self.rows) from None
            found = [_Group([c.combine_chunks() for c in read.columns])]
            table.cache.put(k, found, int(read.nbytes))
        return found[0]  # type: ignore[no-any-return]

    # ---- reading ------------------------------------------------------------------------------

    def _rows(self, k: int, local: np.ndarray[Any, Any]) -> list[list[Any]]:
        """Per field, the values of rows ``local`` of row group ``k``."""
        import pyarrow as pa

        group = self._group(k)
        cols = group.columns
        first = k * self.rows + int(local[0])
        out = []
        take = None
        for f, (e, c) in enumerate(zip(self._entries, self._columns, strict=True)):
            ct = e["type"]
            try:
                if ct is not None and is_stacked(ct):
                    view = group.views.get(f)
                    if view is None:
                        view = group.views[f] = stacked_view(ct, cols[c[0]])
                    out.append(rows_of_view(ct, view, local))
                    continue
                if len(local) == 1:
                    arrays = [cols[j].slice(int(local[0]), 1) for j in c]
                else:
                    take = pa.array(local) if take is None else take
                    arrays = [cols[j].take(take) for j in c]
                out.append(from_arrow(ct, arrays, partial(self._unpickle, first)))
            except (ValueError, TypeError, pa.ArrowException) as exc:
                raise self._corrupt(f"cannot decode field {e['name']!r}: {exc}", first) from None
        return out

    def _unpickle(self, sample: int, data: bytes) -> Any:
        return decode_member(MemberKind.PICKLE, data, self.policy, os.fspath(self.path), sample)

    def _get(self, i: int) -> Sample:
        k, j = divmod(i, self.rows)
        return tuple(values[0] for values in self._rows(k, np.array([j])))

    def _get_many(self, idx: np.ndarray[Any, Any]) -> list[Sample]:
        out: list[Sample | None] = [None] * len(idx)
        groups = idx // self.rows
        order = np.argsort(groups, kind="stable")
        bounds = np.flatnonzero(np.diff(groups[order])) + 1
        runs = np.split(order, bounds) if len(order) else []
        if self.parquet:
            # Cached groups first: in group order, an LRU smaller than the groups a batch
            # touches would evict each group just before the next batch asks for it again.
            cache = self._table.get().cache
            runs.sort(key=lambda run: int(groups[run[0]]) not in cache)
        for run in runs:
            k = int(groups[run[0]])
            values = self._rows(k, idx[run] - k * self.rows)
            for pos, sample in zip(run.tolist(), zip(*values, strict=True), strict=True):
                out[pos] = sample
        return out  # type: ignore[return-value]

    def __reduce__(self) -> tuple[Any, ...]:
        return (TableDataset, (self.root, self.descriptor, self.policy, self.cache_bytes))
