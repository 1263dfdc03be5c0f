"""The dataset index: which samples live in which file, saved beside the data and opened by mmap.

On disk (default ``DIR/.pickleshard/``)::

    index.json                  versioned header + files table (one entry per file)
    samples-<token>.npy         per-sample structured array, opened with mmap_mode="r"

``samples`` has one row per sample, dtype ``[("file", "<u4"), ("item", "<u4")]``: the file's
position in the files table and the sample's position inside that file. Per-sample byte spans
(span indexing) are further ``.npy`` arrays named in the header. There is no Python object per
sample anywhere: forked DataLoader workers share these pages instead of copying them.

The header is written last, by atomic rename, and names the arrays it belongs to, so a reader
sees either the old index or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from ._version import __version__
from .errors import IndexFormatError, StaleIndexError, UnreadableFileError, UnsupportedLayoutError
from .safety import DEFAULT_POLICY, UnpicklePolicy
from .sources import INDEX_DIRNAME, ResolvedSource, Source, resolve_source
from .wholefile import estimate_nbytes, load_layout

__all__ = ["DatasetIndex", "FileEntry", "build_index", "default_index_path", "open_index"]

FORMAT_NAME = "pickleshard-index"
FORMAT_VERSION = 1
SAMPLES_DTYPE = np.dtype([("file", "<u4"), ("item", "<u4")])
_FINGERPRINT_BLOCK = 4096
_FINGERPRINT_BLOCKS = 8

Rebuild = Literal["missing", "auto", "never"]


def fingerprint(path: str | os.PathLike[str]) -> str:
    """A fast content fingerprint: BLAKE2b of the size and 8 evenly spread 4 KiB blocks.

    Reads at most 32 KiB whatever the file size, so checking a whole dataset stays cheap; it
    catches rewrites that keep size and mtime unless every changed byte avoids all 8 blocks.
    """
    where = os.fspath(path)
    h = hashlib.blake2b(digest_size=16)
    try:
        with open(where, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            h.update(size.to_bytes(8, "little"))
            if size <= _FINGERPRINT_BLOCK * _FINGERPRINT_BLOCKS:
                h.update(fh.read())
            else:
                step = (size - _FINGERPRINT_BLOCK) // (_FINGERPRINT_BLOCKS - 1)
                for k in range(_FINGERPRINT_BLOCKS):
                    h.update(os.pread(fh.fileno(), _FINGERPRINT_BLOCK, k * step))
    except OSError as exc:
        raise UnreadableFileError(where, f"cannot read: {exc.strerror or exc}") from None
    return h.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One row of the files table. ``path`` is relative to the dataset root."""

    path: str
    size: int
    mtime_ns: int
    fingerprint: str
    num_samples: int
    decoded_nbytes: int
    layout: str
    fields: tuple[str, ...]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FileEntry:
        return cls(**{**obj, "fields": tuple(obj["fields"])})


def describe_file(root: str, rel: str, policy: UnpicklePolicy = DEFAULT_POLICY) -> FileEntry:
    """Read one file and return its files-table row (run in an index worker process)."""
    path = os.path.join(root, rel)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UnreadableFileError(path, f"cannot stat: {exc.strerror or exc}") from None
    decoded = load_layout(path, policy)
    return FileEntry(
        path=rel,
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        fingerprint=fingerprint(path),
        num_samples=decoded.num_samples,
        decoded_nbytes=estimate_nbytes(decoded.columns),
        layout=decoded.layout,
        fields=decoded.fields,
    )


class DatasetIndex:
    """An opened index: header, files table and the per-sample arrays (memory-mapped)."""

    def __init__(
        self, path: Path, header: dict[str, Any], files: list[FileEntry], samples: np.ndarray
    ) -> None:
        self.path = path
        self.header = header
        self.files = files
        self.samples = samples
        counts = np.fromiter((f.num_samples for f in files), dtype=np.int64, count=len(files))
        self.file_starts = np.concatenate([[0], np.cumsum(counts)])

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.header["fields"])

    @property
    def num_samples(self) -> int:
        return int(self.header["num_samples"])

    def __len__(self) -> int:
        return self.num_samples

    def locate(self, i: int) -> tuple[int, int]:
        """Return ``(file_position, item_in_file)`` of global sample ``i``."""
        row = self.samples[i]
        return int(row["file"]), int(row["item"])

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled for spawned DataLoader workers: reopen by path instead of copying arrays.
        return (DatasetIndex.open, (self.path,))

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> DatasetIndex:
        """Open the index stored in directory ``path`` (arrays are memory-mapped read-only)."""
        where = Path(path)
        header_path = where / "index.json"
        try:
            header = json.loads(header_path.read_text())
        except FileNotFoundError:
            raise IndexFormatError(
                where, "no index.json; build one with `pickleshard index`"
            ) from None
        except (OSError, ValueError) as exc:
            raise IndexFormatError(where, f"cannot read index.json: {exc}") from None
        if header.get("format") != FORMAT_NAME or header.get("version") != FORMAT_VERSION:
            raise IndexFormatError(
                where,
                f"unsupported index format {header.get('format')!r} version {header.get('version')!r}; "
                f"expected {FORMAT_NAME!r} version {FORMAT_VERSION} (rebuild the index)",
            )
        files = [FileEntry.from_json(f) for f in header.pop("files")]
        try:
            samples = np.load(where / header["arrays"]["samples"], mmap_mode="r")
        except (OSError, ValueError, KeyError) as exc:
            raise IndexFormatError(where, f"cannot open per-sample arrays: {exc}") from None
        if samples.dtype != SAMPLES_DTYPE or len(samples) != header["num_samples"]:
            raise IndexFormatError(
                where, "per-sample array does not match the header; rebuild the index"
            )
        return cls(where, header, files, samples)

    def stale_files(self, source: ResolvedSource) -> tuple[list[str], list[str], list[str]]:
        """Return ``(changed, removed, added)`` relative paths between the index and ``source``."""
        indexed = {f.path: f for f in self.files}
        current = set(source.files)
        removed = sorted(set(indexed) - current)
        added = sorted(current - set(indexed))
        changed = []
        for rel in sorted(current & set(indexed)):
            entry = indexed[rel]
            path = source.absolute(rel)
            try:
                st = path.stat()
            except OSError:
                removed.append(rel)
                continue
            if (
                st.st_size != entry.size
                or st.st_mtime_ns != entry.mtime_ns
                or fingerprint(path) != entry.fingerprint
            ):
                changed.append(rel)
        return changed, removed, added

    def check(self, source: ResolvedSource) -> None:
        """Raise :class:`StaleIndexError` naming every file changed, removed or added."""
        changed, removed, added = self.stale_files(source)
        if changed or removed or added:
            raise StaleIndexError(self.path, changed=changed, removed=removed, added=added)


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


def _describe_all(
    source: ResolvedSource, jobs: int, progress: bool, policy: UnpicklePolicy
) -> Iterator[FileEntry]:
    root = os.fspath(source.root)
    bar = tqdm(total=len(source.files), unit="file", desc="index", disable=not progress)
    with bar:
        if jobs <= 1 or len(source.files) == 1:
            for rel in source.files:
                yield describe_file(root, rel, policy)
                bar.update()
            return
        # fork where available (as DataLoader does): spawn and forkserver re-run the caller's
        # __main__, which breaks stdin scripts and scripts without a __main__ guard.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=_pool_context()) as pool:
            futures = {pool.submit(describe_file, root, rel, policy): rel for rel in source.files}
            try:
                for fut in as_completed(futures):
                    yield fut.result()
                    bar.update()
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise


def _check_fields(entries: list[FileEntry], root: Path) -> tuple[str, ...]:
    fields = entries[0].fields
    for e in entries[1:]:
        if e.fields != fields:
            raise UnsupportedLayoutError(
                root / e.path,
                f"fields {list(e.fields)} differ from {list(fields)} in {entries[0].path}; "
                "every file of a dataset must have the same fields",
            )
    return fields


def _write(index_dir: Path, source: ResolvedSource, entries: list[FileEntry]) -> None:
    index_dir.mkdir(parents=True, exist_ok=True)
    fields = _check_fields(entries, source.root)
    total = sum(e.num_samples for e in entries)
    samples = np.empty(total, dtype=SAMPLES_DTYPE)
    start = 0
    for pos, e in enumerate(entries):
        samples["file"][start : start + e.num_samples] = pos
        samples["item"][start : start + e.num_samples] = np.arange(e.num_samples, dtype=np.uint32)
        start += e.num_samples
    token = secrets.token_hex(4)
    samples_name = f"samples-{token}.npy"
    np.save(index_dir / samples_name, samples)
    old = _arrays_of(index_dir)
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "tool_version": __version__,
        "root": os.fspath(source.root),
        "layout": sorted({e.layout for e in entries}),
        "fields": list(fields),
        "num_files": len(entries),
        "num_samples": total,
        "arrays": {"samples": samples_name},
        "files": [asdict(e) for e in entries],
    }
    tmp = index_dir / f"index.json.tmp-{token}"
    tmp.write_text(json.dumps(header, indent=1))
    os.replace(tmp, index_dir / "index.json")
    for name in old:
        if name != samples_name:
            (index_dir / name).unlink(missing_ok=True)


def _arrays_of(index_dir: Path) -> Iterable[str]:
    try:
        header = json.loads((index_dir / "index.json").read_text())
        return list(header.get("arrays", {}).values())
    except (OSError, ValueError):
        return []


def build_index(
    source: Source,
    *,
    index: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    progress: bool = False,
    policy: UnpicklePolicy = DEFAULT_POLICY,
) -> DatasetIndex:
    """Index every pickle file of ``source`` and save the index; return it opened.

    ``index`` is the index directory (default: see :func:`default_index_path`). At most ``jobs``
    files are decoded at once, each in its own process (default: the number of CPUs, at most 8).
    ``policy`` says which globals may load while files are read (default: the allowlist).
    Raises the :class:`~pickleshard.errors.PickleshardError` of the first bad file found.
    """
    resolved = resolve_source(source)
    index_dir = Path(index) if index is not None else default_index_path(resolved)
    n_jobs = jobs if jobs is not None else min(os.cpu_count() or 1, 8)
    by_path = {e.path: e for e in _describe_all(resolved, n_jobs, progress, policy)}
    entries = [by_path[rel] for rel in resolved.files]
    _write(index_dir, resolved, entries)
    return DatasetIndex.open(index_dir)


def open_index(
    source: Source,
    *,
    index: str | os.PathLike[str] | None = None,
    rebuild: Rebuild = "missing",
    jobs: int | None = None,
    progress: bool = False,
    policy: UnpicklePolicy = DEFAULT_POLICY,
) -> tuple[DatasetIndex, ResolvedSource]:
    """Open the index of ``source``, checking it against the files on disk.

    ``rebuild="missing"`` (default) builds an index that does not exist yet and raises
    :class:`StaleIndexError` on a stale one; ``"auto"`` also rebuilds a stale one; ``"never"``
    only opens.
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
    }
    if not (index_dir / "index.json").exists() and rebuild != "never":
        return build_index(source, **kwargs), resolved
    opened = DatasetIndex.open(index_dir)
    try:
        opened.check(resolved)
    except StaleIndexError:
        if rebuild != "auto":
            raise
        return build_index(source, **kwargs), resolved
    return opened, resolved
