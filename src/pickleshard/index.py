"""The dataset index: which samples live in which file and where, saved beside the data, opened by mmap.

On disk (default ``DIR/.pickleshard/``)::

    index.json                  versioned header + files table (one entry per file) + skipped
    samples-<token>.npy         per-sample (file, item in file), dtype [("file", u4), ("item", u4)]
    starts-<token>.npy          per sample and field: span start offset, (rows, F) int64
    ends-<token>.npy            per sample and field: span end offset, (rows, F) int64
    memo_base-<token>.npy       per sample and field: first memo key of the span, (rows, F) int64
    ext_offsets-<token>.npy     CSR offsets into ext_keys, N * F + 1 per span file, int64
    ext_keys-<token>.npy        memo keys each span needs from earlier elements, int64
    records-<token>.npy         (start, end, memo-key shift) of each pickle in a file, (R, 3)

The span arrays (:data:`~pickleshard.indexfiles.SPAN_ARRAYS`, what
:meth:`pickleshard.scan.ScanResult.arrays_dict` returns) are concatenated over the files indexed
in ``"span"`` mode, in files-table order; a file's entry names its first row in each
(``span_row``, ``ext_row``, ``record_row``) and holds the scanner's per-file meta (``scan``:
layout, fields, kinds, array rows, shared table). ``ext_offsets`` values point into the
concatenated ``ext_keys``. Files indexed in ``"whole"`` mode (the scanner refused them: protocol
0/1, a layout it cannot prove; ``reason`` says why) take no span rows and are unpickled whole.
``skipped`` lists the files ``skip_bad=True`` left out, each with its error. There is no Python
object per sample anywhere: forked DataLoader workers share these pages instead of copying them.

The header is written last, by atomic rename, and names the arrays it belongs to (with each
one's CRC-32, ``checksums``), so a reader sees either the old index or the new one, never a mix.
An index is untrusted input (it may come with a downloaded dataset): :meth:`DatasetIndex.open`
checks every part of it (:mod:`pickleshard.indexcheck` for ``index.json``,
:mod:`pickleshard.indexarrays` for the arrays) and raises :class:`IndexFormatError` naming the
index file and what is wrong; ``rebuild="auto"`` rebuilds such an index instead. Version 2
indexes (no checksums) count as older: rebuilt by ``"missing"`` and ``"auto"``. Building keeps at most one file's span
arrays in a worker's memory: workers save them to a staging folder, and the parent copies them
into the final arrays through a memory map.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from ._version import __version__
from .errors import (
    FileProblem,
    IndexFormatError,
    NotSpanIndexableError,
    StaleIndexError,
    UnsupportedLayoutError,
)
from .indexarrays import SAMPLES_DTYPE, check_arrays, expected_shapes, file_checksum, load_array
from .indexcheck import ARRAY_NAME, IndexProblem, check_header, read_header, show
from .indexfiles import SPAN_ARRAYS, Described, FileEntry, describe_file, fingerprint, staged_name
from .safety import DEFAULT_POLICY, UnpicklePolicy
from .scan import ScanResult
from .sources import INDEX_DIRNAME, ResolvedSource, Source, resolve_source

__all__ = [
    "DatasetIndex",
    "FileEntry",
    "SkippedFile",
    "SkippedFilesWarning",
    "build_index",
    "default_index_path",
    "fingerprint",
    "open_index",
]

FORMAT_NAME = "pickleshard-index"
# 3: a checksum per array (and the whole index validated on open); older ones are rebuilt
FORMAT_VERSION = 3
_I8 = np.dtype(np.int64)

Rebuild = Literal["missing", "auto", "never"]
SkippedFile = dict[str, Any]  # {"path", "error", "message", "size", "mtime_ns", "ctime_ns", "ino"}


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

    def locate_many(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(file_positions, items_in_file)`` (int64 arrays) of global samples ``indices``."""
        rows = self._rows[indices]
        return rows["file"].astype(np.int64), rows["item"].astype(np.int64)

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
        :mod:`pickleshard.indexcheck`), and any violation raises :class:`IndexFormatError`
        naming the index file and what is wrong."""
        where = Path(path)
        header = read_header(where)
        if header.get("format") != FORMAT_NAME or header.get("version") != FORMAT_VERSION:
            older = header.get("format") == FORMAT_NAME and _older(header.get("version"))
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

    def stale_files(self, source: ResolvedSource) -> tuple[list[str], list[str], list[str]]:
        """Return ``(changed, removed, added)`` relative paths between the index and ``source``.

        A file has changed when its size, ``st_mtime_ns``, ``st_ctime_ns`` or ``st_ino``
        differs from the files table, or its :func:`fingerprint` does. The ctime catches a
        rewrite that restores size and mtime (``os.utime`` sets the ctime too) and changes only
        bytes the fingerprint does not sample. Rows of an index written before ctime and inode
        were stored are checked without them. There is no cheaper full-content re-check: a
        copy of the dataset (``cp -a``, ``rsync -a``, a restored backup) has new inodes and
        ctimes, so every copied file reads as changed and the index must be rebuilt
        (``rebuild="auto"`` or ``pickleshard index``); so does a file whose mode or owner
        changed. Moving or renaming the dataset's directory keeps both: its index stays fresh.

        Skipped files count as indexed: one that changes or goes away makes the index stale.
        """
        indexed = {f.path: f for f in self.files}
        skipped = {s["path"]: s for s in self.skipped}
        current = set(source.files)
        known = set(indexed) | set(skipped)
        removed = sorted(known - current)
        added = sorted(current - known)
        changed = []
        for rel in sorted(current & known):
            path = source.absolute(rel)
            try:
                st = path.stat()
            except OSError:
                if rel in indexed:
                    removed.append(rel)
                continue
            if rel in skipped:
                s = skipped[rel]
                if not _same_stat(st, s["size"], s["mtime_ns"], s.get("ctime_ns"), s.get("ino")):
                    changed.append(rel)
                continue
            e = indexed[rel]
            if (
                not _same_stat(st, e.size, e.mtime_ns, e.ctime_ns, e.ino)
                or fingerprint(path) != e.fingerprint
            ):
                changed.append(rel)
        return changed, removed, added

    def check(self, source: ResolvedSource) -> None:
        """Raise :class:`StaleIndexError` naming every file changed, removed or added."""
        changed, removed, added = self.stale_files(source)
        if changed or removed or added:
            indexed = {f.path: f for f in self.files}
            relinked = [
                rel for rel in changed if rel in indexed and _relinked(source, indexed[rel])
            ]
            raise StaleIndexError(
                self.path, changed=changed, removed=removed, added=added, relinked=relinked
            )


def _relinked(source: ResolvedSource, entry: FileEntry) -> bool:
    """Whether a changed file differs from its row only by inode or ctime."""
    path = source.absolute(entry.path)
    try:
        st = path.stat()
    except OSError:
        return False
    return _same_stat(st, entry.size, entry.mtime_ns, None, None) and (
        fingerprint(path) == entry.fingerprint
    )


def _same_stat(
    st: os.stat_result, size: int, mtime_ns: int, ctime_ns: int | None, ino: int | None
) -> bool:
    """Whether ``st`` matches what was recorded; a None ctime or inode (from an index written
    before they were stored) is not compared."""
    return (
        st.st_size == size
        and st.st_mtime_ns == mtime_ns
        and (ctime_ns is None or st.st_ctime_ns == ctime_ns)
        and (ino is None or st.st_ino == ino)
    )


def _older(version: object) -> bool:
    return isinstance(version, int) and version < FORMAT_VERSION


def default_index_path(source: ResolvedSource) -> Path:
    """``DIR/.pickleshard`` for a directory; for a glob or file list, a subfolder keyed by the list."""
    base = source.root / INDEX_DIRNAME
    if source.is_directory:
        return base
    key = hashlib.blake2b("\n".join(source.files).encode(), digest_size=6).hexdigest()
    return base / f"files-{key}"


def _pool_context() -> BaseContext:
    methods = get_all_start_methods()
    return get_context("fork" if "fork" in methods else "spawn")


Outcome = tuple[int, Described | FileProblem]


def _describe_all(
    source: ResolvedSource,
    staging: Path | None,
    jobs: int,
    progress: bool,
    policy: UnpicklePolicy,
    skip_bad: bool,
) -> Iterator[Outcome]:
    """``(position, described)`` for every file, in completion order; with ``skip_bad`` a bad
    file yields its error instead of raising it."""
    root = os.fspath(source.root)
    bar = tqdm(total=len(source.files), unit="file", desc="index", disable=not progress)
    with bar:
        if jobs <= 1 or len(source.files) == 1:
            for pos, rel in enumerate(source.files):
                try:
                    yield pos, describe_file(root, rel, pos, staging, policy)
                except FileProblem as exc:
                    if not skip_bad:
                        raise
                    yield pos, exc
                bar.update()
            return
        # fork where available (as DataLoader does): spawn and forkserver re-run the caller's
        # __main__, which breaks stdin scripts and scripts without a __main__ guard.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=_pool_context()) as pool:
            futures = {
                pool.submit(describe_file, root, rel, pos, staging, policy): pos
                for pos, rel in enumerate(source.files)
            }
            try:
                for fut in as_completed(futures):
                    try:
                        yield futures[fut], fut.result()
                    except FileProblem as exc:
                        if not skip_bad:
                            raise
                        yield futures[fut], exc
                    bar.update()
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise


def _skip_record(source: ResolvedSource, rel: str, exc: FileProblem) -> SkippedFile:
    try:
        st = source.absolute(rel).stat()
        size, mtime_ns, ctime_ns, ino = st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
    except OSError:
        size, mtime_ns, ctime_ns, ino = None, None, None, None
    return {
        "path": rel,
        "error": type(exc).__name__,
        "message": str(exc),
        "size": size,
        "mtime_ns": mtime_ns,
        "ctime_ns": ctime_ns,
        "ino": ino,
    }


def _check_fields(
    described: dict[int, Described], source: ResolvedSource, skip_bad: bool
) -> tuple[list[Described], list[SkippedFile]]:
    """The files (in files-table order) whose fields match those of the first file, or with
    ``skip_bad`` those of most files; the others are skipped with ``skip_bad``, else the first
    of them raises."""
    ordered = [described[p] for p in sorted(described)]
    if not ordered:
        return [], []
    first = ordered[0].entry
    if skip_bad:
        common = Counter(d.entry.fields for d in ordered).most_common(1)[0][0]
        first = next(d.entry for d in ordered if d.entry.fields == common)
    kept, skipped = [], []
    for d in ordered:
        if d.entry.fields == first.fields:
            kept.append(d)
            continue
        err = UnsupportedLayoutError(
            source.absolute(d.entry.path),
            f"fields {list(d.entry.fields)} differ from {list(first.fields)} in {first.path}; "
            "every file of a dataset must have the same fields",
        )
        if not skip_bad:
            raise err
        skipped.append(_skip_record(source, d.entry.path, err))
    return kept, skipped


def _save_concatenated(
    path: Path, parts: Iterable[np.ndarray], total: int, dtype: Any, tail: tuple[int, ...] = ()
) -> None:
    """Write ``parts`` (``total`` rows in all) one after another as one ``.npy``, through a
    memory map, so that they are never all in memory at once."""
    if total == 0:
        np.save(path, np.empty((0, *tail), dtype))
        return
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(total, *tail))
    at = 0
    for p in parts:
        out[at : at + len(p)] = p
        at += len(p)
    out.flush()
    del out


def _place(kept: list[Described], nf: int) -> list[FileEntry]:
    """The files table: each span file gets its first row in each span array."""
    final: list[FileEntry] = []
    row = ext = rec = 0
    for d in kept:
        e = d.entry
        if e.mode == "span":
            e = replace(e, span_row=row, ext_row=ext, record_row=rec)
            row, ext, rec = row + e.num_samples, ext + e.num_samples * nf + 1, rec + d.records
        final.append(e)
    return final


def _write(
    index_dir: Path,
    source: ResolvedSource,
    kept: list[Described],
    staging: Path | None,
    skipped: list[SkippedFile],
) -> None:
    fields = kept[0].entry.fields if kept else ()
    nf = len(fields)
    final = _place(kept, nf)
    token = secrets.token_hex(4)
    names = {"samples": f"samples-{token}.npy", **{a: f"{a}-{token}.npy" for a in SPAN_ARRAYS}}
    total = sum(e.num_samples for e in final)

    def sample_rows() -> Iterator[np.ndarray]:
        for k, e in enumerate(final):
            part = np.empty(e.num_samples, SAMPLES_DTYPE)
            part["file"], part["item"] = k, np.arange(e.num_samples, dtype=np.uint32)
            yield part

    _save_concatenated(index_dir / names["samples"], sample_rows(), total, SAMPLES_DTYPE)
    spans = [d for d in kept if d.entry.mode == "span"]
    pos_of = {rel: p for p, rel in enumerate(source.files)}

    def staged(array: str) -> Iterator[np.ndarray]:
        assert staging is not None
        key_base = 0
        for d in spans:
            part = np.load(staged_name(staging, pos_of[d.entry.path], array), mmap_mode="r")
            # ext_offsets point into the concatenated ext_keys: shift by the keys before them
            yield part + key_base if array == "ext_offsets" else part
            key_base += d.ext_keys

    rows = sum(d.entry.num_samples for d in spans)
    sizes = {
        "starts": (rows, (nf,)),
        "ends": (rows, (nf,)),
        "memo_base": (rows, (nf,)),
        "ext_offsets": (rows * nf + len(spans), ()),
        "ext_keys": (sum(d.ext_keys for d in spans), ()),
        "records": (sum(d.records for d in spans), (3,)),
    }
    for array, (n, tail) in sizes.items():
        _save_concatenated(index_dir / names[array], staged(array), n, np.int64, tail)

    old = _arrays_of(index_dir)
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "tool_version": __version__,
        "root": os.fspath(source.root),
        "layout": sorted({e.layout for e in final}),
        "fields": list(fields),
        "num_files": len(final),
        "num_samples": total,
        "modes": {m: sum(e.mode == m for e in final) for m in ("span", "whole")},
        "arrays": names,
        "checksums": {k: file_checksum(index_dir / v) for k, v in names.items()},
        "files": [asdict(e) for e in final],
        "skipped": sorted(skipped, key=lambda s: str(s["path"])),
    }
    tmp = index_dir / f"index.json.tmp-{token}"
    tmp.write_text(json.dumps(header, indent=1))
    os.replace(tmp, index_dir / "index.json")
    for name in old:
        if name not in names.values():
            (index_dir / name).unlink(missing_ok=True)


def _arrays_of(index_dir: Path) -> Iterable[str]:
    """The array files the current header names, to delete once replaced: only plain names
    of the index directory (an edited header must not make a rebuild delete anything else)."""
    try:
        arrays = read_header(index_dir).get("arrays")
    except IndexFormatError:
        return []
    if not isinstance(arrays, dict):
        return []
    return [v for v in arrays.values() if isinstance(v, str) and ARRAY_NAME.fullmatch(v)]


def _staging_dir(index_dir: Path) -> Path:
    """Where workers save span arrays: inside the index directory (same file system as the
    final arrays), or a temporary folder when it cannot be created (the bad files are then
    still reported before the index directory's own error)."""
    try:
        index_dir.mkdir(parents=True, exist_ok=True)
        staging = index_dir / f".staging-{secrets.token_hex(4)}"
        staging.mkdir()
    except OSError:
        return Path(tempfile.mkdtemp(prefix="pickleshard-staging-"))
    return staging


def build_index(
    source: Source,
    *,
    index: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = False,
    policy: UnpicklePolicy = DEFAULT_POLICY,
    spans: bool = True,
    skip_bad: bool = False,
) -> DatasetIndex:
    """Index every pickle file of ``source`` and save the index; return it opened.

    ``index`` is the index directory (default: see :func:`default_index_path`). At most ``jobs``
    files are indexed at once, each in its own process (default: the number of CPUs, at most 8).
    Each file is scanned for its sample spans without unpickling it (``spans=False``: every file
    is unpickled whole to count its samples, the pre-span behaviour); a file the scanner refuses
    is unpickled whole and recorded as such, with the reason. ``policy`` says which globals may
    load while files are unpickled (default: the allowlist) and the text encoding.

    Raises the :class:`~pickleshard.errors.PickleshardError` of the first bad file found; with
    ``skip_bad=True`` every good file is indexed and each bad one is listed in
    :attr:`DatasetIndex.skipped` with its error (nothing is dropped silently).
    """
    resolved = resolve_source(source)
    index_dir = Path(index) if index is not None else default_index_path(resolved)
    n_jobs = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    staging = _staging_dir(index_dir) if spans else None
    try:
        described: dict[int, Described] = {}
        skipped: list[SkippedFile] = []
        for pos, got in _describe_all(resolved, staging, n_jobs, progress, policy, skip_bad):
            if isinstance(got, Described):
                described[pos] = got
            else:
                skipped.append(_skip_record(resolved, resolved.files[pos], got))
        kept, mismatched = _check_fields(described, resolved, skip_bad)
        index_dir.mkdir(parents=True, exist_ok=True)
        _write(index_dir, resolved, kept, staging, skipped + mismatched)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return DatasetIndex.open(index_dir)


def open_index(
    source: Source,
    *,
    index: str | os.PathLike[str] | None = None,
    rebuild: Rebuild = "missing",
    jobs: int | None = None,
    progress: bool = False,
    policy: UnpicklePolicy = DEFAULT_POLICY,
    skip_bad: bool = False,
) -> tuple[DatasetIndex, ResolvedSource]:
    """Open the index of ``source``, checking it against the files on disk.

    ``rebuild="missing"`` (default) builds an index that does not exist yet, or that an older
    pickleshard wrote in an older format, and raises :class:`StaleIndexError` on a stale one
    and :class:`IndexFormatError` on a damaged or edited one (every part of an index is
    checked when it is opened, see :mod:`pickleshard.indexcheck`); ``"auto"`` also rebuilds a
    stale or a damaged one; ``"never"`` only opens. What counts as changed is
    :meth:`DatasetIndex.stale_files`' rule (a copied dataset's files all do; a moved one's do
    not). ``skip_bad`` is passed to :func:`build_index` when it builds.
    """
    if rebuild not in ("missing", "auto", "never"):
        raise ValueError(f"rebuild must be 'missing', 'auto' or 'never', got {rebuild!r}")
    resolved = resolve_source(source)
    index_dir = Path(index) if index is not None else default_index_path(resolved)
    kwargs: dict[str, Any] = {
        "index": index_dir,
        "jobs": jobs,
        "progress": progress,
        "policy": policy,
        "skip_bad": skip_bad,
    }
    if rebuild != "never":
        if not (index_dir / "index.json").exists():
            return build_index(source, **kwargs), resolved
        try:
            stored = read_header(index_dir)
        except IndexFormatError:
            stored = {}
        if stored.get("format") == FORMAT_NAME and _older(stored.get("version")):
            return build_index(source, **kwargs), resolved
    try:
        opened = DatasetIndex.open(index_dir)
    except IndexFormatError:
        if rebuild != "auto":
            raise
        return build_index(source, **kwargs), resolved  # damaged or edited: built afresh
    try:
        opened.check(resolved)
    except StaleIndexError:
        if rebuild != "auto":
            raise
        return build_index(source, **kwargs), resolved
    return opened, resolved
