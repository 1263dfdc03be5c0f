"""The opened index: :class:`DatasetIndex`, its files table and per-sample arrays, memory-mapped.

On disk (default ``DIR/.pickleshard/``, see :mod:`pickleshard.index.ondisk`)::

    index.json                  versioned header + files table (one entry per file) + skipped
    samples-<token>.npy         per-sample (file, item in file), dtype [("file", u4), ("item", u4)]
    starts-<token>.npy          per sample and field: span start offset, (rows, F) int64
    ends-<token>.npy            per sample and field: span end offset, (rows, F) int64
    memo_base-<token>.npy       per sample and field: first memo key of the span, (rows, F) int64
    ext_offsets-<token>.npy     CSR offsets into ext_keys, N * F + 1 per span file, int64
    ext_keys-<token>.npy        memo keys each span needs from earlier elements, int64
    records-<token>.npy         (start, end, memo-key shift) of each pickle in a file, (R, 3)

The span arrays (:data:`~pickleshard.index.ondisk.SPAN_ARRAYS`, what
:meth:`pickleshard.scan.ScanResult.arrays_dict` returns) are concatenated over the files indexed
in ``"span"`` mode, in files-table order; a file's entry names its first row in each
(``span_row``, ``ext_row``, ``record_row``) and holds the scanner's per-file meta (``scan``:
layout, fields, kinds, array rows, shared table). ``ext_offsets`` values point into the
concatenated ``ext_keys``. Files indexed in ``"whole"`` mode (the scanner refused them: protocol
0/1, a layout it cannot prove; ``reason`` says why) take no span rows and are unpickled whole.
``skipped`` lists the files ``skip_bad=True`` left out, each with its error. There is no Python
object per sample anywhere: forked DataLoader workers share these pages instead of copying them.

An index is untrusted input (it may come with a downloaded dataset): :meth:`DatasetIndex.open`
checks every part of it (:mod:`pickleshard.index.validate` for ``index.json``,
:mod:`pickleshard.index.arrays` and :mod:`pickleshard.index.contents` for the arrays) and raises
:class:`IndexFormatError` naming the index file and what is wrong. Version 2 indexes (no
checksums) count as older (:func:`~pickleshard.index.ondisk.is_older`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError, NotSpanIndexableError
from ..io.listing import ResolvedSource
from ..scan import ScanResult
from ..scan.sampleform import SampleForm
from .arrays import expected_shapes, load_array
from .checking import IndexProblem, show
from .contents import check_arrays
from .files import FileEntry, SkippedFile
from .ondisk import FORMAT_NAME, FORMAT_VERSION, SAMPLES_DTYPE, SPAN_ARRAYS, is_older, read_header
from .staleness import check_fresh, find_stale
from .validate import check_header

__all__ = ["DatasetIndex", "SkippedFilesWarning"]

_I8 = np.dtype(np.int64)


class SkippedFilesWarning(UserWarning):
    """A dataset's index left out bad files (``skip_bad=True``): their samples are missing."""


class DatasetIndex:
    """An opened index: header, files table, skipped files and the per-sample arrays (mmap)."""

    def __init__(
        self,
        path: Path,
        header: dict[str, Any],
        files: list[FileEntry],
        samples: np.ndarray,
        spans: dict[str, np.ndarray] | None = None,
        skipped: list[SkippedFile] | None = None,
    ) -> None:
        self.path = path
        self.header = header
        self.files = files
        self.samples = samples
        self.spans = spans or {}
        self.skipped = skipped or []
        # Plain ndarray views of the same mapped pages: np.memmap's per-index subclass hooks
        # cost more than a span read's own bookkeeping.
        self._rows = np.asarray(samples)
        self._spans = {k: np.asarray(v) for k, v in self.spans.items()}
        counts = np.fromiter((f.num_samples for f in files), dtype=np.int64, count=len(files))
        self.file_starts = np.concatenate([[0], np.cumsum(counts)])
        # what the producer wrote (tuples or dicts): every reader hands samples out in it
        self.sample_form = SampleForm(header["sample_form"], self.fields)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.header["fields"])

    @property
    def num_samples(self) -> int:
        return int(self.header["num_samples"])

    @property
    def modes(self) -> tuple[str, ...]:
        """``"span"`` or ``"whole"`` for each file of the files table."""
        return tuple(f.mode for f in self.files)

    def __len__(self) -> int:
        return self.num_samples

    def locate(self, i: int) -> tuple[int, int]:
        """Return ``(file_position, item_in_file)`` of global sample ``i``."""
        row = self._rows[i]
        return int(row["file"]), int(row["item"])

    def scan(self, pos: int, path: str | os.PathLike[str]) -> ScanResult:
        """The :class:`ScanResult` of span-indexed file ``pos`` (found at ``path``), made of
        views of the memory-mapped span arrays; raises :class:`NotSpanIndexableError` for a file
        indexed whole. Its ``ext_keys`` is the index-wide array and its ``ext_offsets`` point
        into it (they do not start at 0), so :meth:`ScanResult.externals` needs no copy."""
        entry = self.files[pos]
        if entry.mode != "span" or entry.scan is None:
            raise NotSpanIndexableError(path, entry.reason or "indexed without spans")
        n, nf = entry.num_samples, len(entry.fields)
        r, e, q = entry.span_row, entry.ext_row, entry.record_row
        nrec = int(entry.scan["num_records"])
        sp = self._spans
        arrays = {
            "starts": sp["starts"][r : r + n],
            "ends": sp["ends"][r : r + n],
            "memo_base": sp["memo_base"][r : r + n],
            "ext_offsets": sp["ext_offsets"][e : e + n * nf + 1],
            "ext_keys": sp["ext_keys"],
            "records": sp["records"][q : q + nrec],
        }
        return ScanResult.from_stored(path, entry.scan, arrays)

    def check_decoded(
        self, pos: int, path: str | os.PathLike[str], num_samples: int, fields: tuple[str, ...]
    ) -> None:
        """Raise :class:`IndexFormatError` unless file ``pos``, unpickled whole from ``path``,
        has the sample count and fields its row records (a row edited to move samples between
        files would otherwise index past a column's end, or never reach its last samples)."""
        entry = self.files[pos]
        if (num_samples, fields) != (entry.num_samples, entry.fields):
            raise IndexFormatError(
                self.path / "index.json",
                f"files[{pos}] records {entry.num_samples} samples of fields "
                f"{list(entry.fields)}, but {os.fspath(path)} holds {num_samples} of "
                f"{list(fields)}: the index was edited or the file changed since; rebuild it",
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled for spawned DataLoader workers: reopen by path instead of copying arrays.
        return (DatasetIndex.open, (self.path,))

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> DatasetIndex:
        """Open the index stored in directory ``path`` (arrays are memory-mapped read-only).

        The index is untrusted input: every part is checked first (see
        :mod:`pickleshard.index.validate`), and any violation raises :class:`IndexFormatError`
        naming the index file and what is wrong."""
        where = Path(path)
        header = read_header(where)
        if header.get("format") != FORMAT_NAME or header.get("version") != FORMAT_VERSION:
            older = header.get("format") == FORMAT_NAME and is_older(header.get("version"))
            raise IndexFormatError(
                where / "index.json",
                f"unsupported index format {show(header.get('format'))} version "
                f"{show(header.get('version'))}; expected {FORMAT_NAME!r} version "
                f"{FORMAT_VERSION} "
                + (
                    "(written by an older pickleshard: rebuild it with `pickleshard index`, "
                    "or open it with rebuild='missing' or 'auto')"
                    if older
                    else "(rebuild the index)"
                ),
            )
        try:
            files, skipped, checks = check_header(header)
            nf = len(header["fields"])
            shapes = expected_shapes(files, nf)
            names, sums = header["arrays"], header["checksums"]
            arrays = {
                name: load_array(
                    where,
                    names[name],
                    SAMPLES_DTYPE if name == "samples" else _I8,
                    shapes[name],
                    sums[name],
                )
                for name in ("samples", *SPAN_ARRAYS)
            }
            check_arrays(files, checks, nf, arrays, names)
        except IndexProblem as exc:
            raise exc.error(where) from None
        del header["files"]
        header.pop("skipped", None)
        samples = arrays.pop("samples")
        return cls(where, header, files, samples, arrays, skipped)

    @classmethod
    def written(
        cls, path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]
    ) -> DatasetIndex:
        """The index this process has just written to directory ``path``: ``header`` as parsed
        from the bytes written, ``arrays`` each array mapped from its file. What :meth:`open`
        would give, without reading back and checking what was computed here (the arrays'
        checksums were taken over the bytes as they were written): the header's own checks
        still run, as they turn its entries into :class:`FileEntry` records."""
        try:
            files, skipped, _ = check_header(header)
        except IndexProblem as exc:
            raise exc.error(path) from None
        header = {k: v for k, v in header.items() if k not in ("files", "skipped")}
        spans = {k: v for k, v in arrays.items() if k != "samples"}
        return cls(path, header, files, arrays["samples"], spans, skipped)

    def stale_files(self, source: ResolvedSource) -> tuple[list[str], list[str], list[str]]:
        """Return ``(changed, removed, added)`` relative paths between the index and ``source``
        (what counts as changed: :mod:`pickleshard.index.staleness`; a copied dataset's files
        all do, a moved one's do not). Skipped files count as indexed: one that changes or goes
        away makes the index stale."""
        stale = find_stale(self.files, self.skipped, source)
        return stale.changed, stale.removed, stale.added

    def check(self, source: ResolvedSource) -> None:
        """Raise :class:`StaleIndexError` naming every file changed, removed or added."""
        check_fresh(self.path, self.files, self.skipped, source)
