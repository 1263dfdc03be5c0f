"""Writing an index: the per-sample arrays copied from the workers' staging folder (or, for
files described in this process, from memory: :attr:`Described.arrays`), then the header, last,
by atomic rename. Each array's CRC-32 is computed over the bytes as they are written, never by
reading the file back; the reader checks it where the index is opened.

The header names the arrays it belongs to (each file name carries a fresh token) with each
one's CRC-32, so a reader sees either the old index or the new one, never a mix; the new arrays
are on disk (``fsync``) before the header that names them replaces the old one, and the old
arrays are deleted only once it has. The ``fsync`` runs in a thread of its own while this one
writes the next arrays, encodes the header and maps the arrays it wrote for the index returned
(a first open waited on the disk's commits, 3-10 ms, with nothing else to do). The parent never
holds more than one file's span arrays at once: each final array is written part by part, with
plain writes.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import fields as fields_of
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .._version import __version__
from ..errors import IndexFormatError
from ..index.files import FileEntry, SkippedFile
from ..index.model import DatasetIndex
from ..index.ondisk import (
    ARRAY_NAME,
    FORMAT_NAME,
    FORMAT_VERSION,
    SAMPLES_DTYPE,
    SPAN_ARRAYS,
    read_header,
)
from ..io.atomic import write_bytes_atomic
from ..io.listing import ResolvedSource
from ..io.remote.listing import without_credentials
from ..scan.sampleform import SampleForm
from .describe import Described, staged_name

__all__ = ["write_index"]


class Saved(NamedTuple):
    """An array :func:`_save_concatenated` wrote: its checksum, its still open descriptor (to
    be synced, then closed by the caller), and where its data starts."""

    checksum: str
    fd: int
    offset: int


def _save_concatenated(
    path: Path, parts: Iterable[np.ndarray], total: int, dtype: Any, tail: tuple[int, ...] = ()
) -> Saved:
    """Write ``parts`` (``total`` rows of ``tail`` in all) one after another as one new
    ``.npy`` at ``path``, a part at a time (they are never all in memory at once), by plain
    writes (a memory map's flush cost more than the scan of a small dataset); returns the
    file's checksum (:func:`~pickleshard.index.arrays.array_checksum` of what was written), its
    open descriptor and its header's length."""
    dtype = np.dtype(dtype)
    head = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
    np.lib.format.write_array_header_1_0(head, {**header, "shape": (total, *tail)})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        crc = _write(fd, head.getvalue(), 0)
        rows = 0
        for p in parts:
            part = np.ascontiguousarray(p, dtype=dtype)
            if part.shape[1:] != tail or rows + len(part) > total:
                raise ValueError(f"{path.name}: a part of shape {part.shape} after {rows} rows")
            crc = _write(fd, part.tobytes(), crc)
            rows += len(part)
        if rows != total:
            raise ValueError(f"{path.name}: {rows} rows written, {total} expected")
    except BaseException:
        os.close(fd)
        raise
    return Saved(f"crc32:{crc:08x}", fd, len(head.getvalue()))


def _write(fd: int, data: bytes, crc: int) -> int:
    """Write all of ``data`` at ``fd``; the CRC-32 ``crc`` continued over it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return zlib.crc32(data, crc)


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


def write_index(
    index_dir: Path,
    source: ResolvedSource,
    kept: list[Described],
    staging: Path | None,
    skipped: list[SkippedFile],
    layout: str = "auto",
) -> DatasetIndex:
    """Write the index of ``kept`` (the described files that stay, in files-table order, whose
    span arrays lie in ``staging``) and ``skipped`` into ``index_dir``, replacing the index
    there (the old arrays are deleted once the new header names the new ones). ``layout`` is
    the ``layout=`` the files were read as. Returns the index written, as
    :meth:`DatasetIndex.open <pickleshard.index.model.DatasetIndex.open>` would open it."""
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

    spans = [d for d in kept if d.entry.mode == "span"]
    pos_of = {rel: p for p, rel in enumerate(source.files)}

    def staged(array: str) -> Iterator[np.ndarray]:
        key_base = 0
        for d in spans:  # (none when the index has no span files: no staging either)
            if d.arrays is not None:  # described in this process: never staged
                part = d.arrays[array]
            else:
                assert staging is not None
                part = np.load(staged_name(staging, pos_of[d.entry.path], array))
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
    written: dict[str, Saved] = {}
    shapes = {"samples": ((total,), SAMPLES_DTYPE)} | {
        a: ((n, *tail), np.int64) for a, (n, tail) in sizes.items()
    }
    # Each new array is synced (fsync) before the header that names them replaces the old one
    # (a crash then leaves the old index or a whole new one), in a thread of its own, from when
    # it is written: the disk's commits overlap the other arrays' writes, the header's encoding
    # and the mapping of what was written (concurrent fsync calls, a thread each, measured no
    # faster here: 2.9-3.4 ms against 2.8-4.4 ms for 7 arrays, and their threads' start costs).
    syncing = ThreadPoolExecutor(max_workers=1)
    synced: list[Future[None]] = []
    try:
        path = index_dir / names["samples"]
        written["samples"] = _save_concatenated(path, sample_rows(), total, SAMPLES_DTYPE)
        synced.append(syncing.submit(os.fsync, written["samples"].fd))
        for array, (n, tail) in sizes.items():
            path = index_dir / names[array]
            written[array] = _save_concatenated(path, staged(array), n, np.int64, tail)
            synced.append(syncing.submit(os.fsync, written[array].fd))
        header = _header(source, final, skipped, layout, fields, total, names, written)
        data = json.dumps(header, indent=1).encode()
        # what DatasetIndex.open would read back and check: the header's bytes parsed, the
        # arrays mapped (their checksums were taken as they were written), each as np.load
        # maps it (np.lib.format.open_memmap: the same np.memmap) from the header this wrote,
        # not by parsing it back (np.load: ~0.1 ms an array, its header through ast)
        arrays: dict[str, np.ndarray] = {
            k: np.memmap(index_dir / v, shapes[k][1], "r", written[k].offset, shapes[k][0])
            for k, v in names.items()
        }
        opened = DatasetIndex.written(index_dir, json.loads(data), arrays)
        for done in synced:
            done.result()
    except BaseException:  # the old index stays as it was: no new array left behind
        syncing.shutdown(wait=True, cancel_futures=True)
        for name in names.values():
            (index_dir / name).unlink(missing_ok=True)
        raise
    finally:
        syncing.shutdown(wait=True)  # no descriptor closed under an fsync
        for saved in written.values():
            os.close(saved.fd)

    old = _arrays_of(index_dir)
    write_bytes_atomic(index_dir / "index.json", data)
    for name in old:
        if name not in names.values():
            (index_dir / name).unlink(missing_ok=True)
    return opened


def _header(
    source: ResolvedSource,
    final: list[FileEntry],
    skipped: list[SkippedFile],
    layout: str,
    fields: tuple[str, ...],
    total: int,
    names: dict[str, str],
    written: dict[str, Saved],
) -> dict[str, Any]:
    """The header naming the arrays ``names`` with their checksums (``written``)."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "tool_version": __version__,
        "root": without_credentials(os.fspath(source.root)),  # a record, never read back
        "layout": sorted({e.layout for e in final}),
        "layout_choice": layout,
        "fields": list(fields),
        "sample_form": SampleForm.of_layouts((e.layout for e in final), fields).kind,
        "num_files": len(final),
        "num_samples": total,
        "modes": {m: sum(e.mode == m for e in final) for m in ("span", "whole")},
        "arrays": names,
        "checksums": {k: written[k].checksum for k in names},
        # its fields as they are: plain JSON values (asdict's deep copy cost 0.85 ms of 8 rows)
        "files": [{f.name: getattr(e, f.name) for f in fields_of(e)} for e in final],
        "skipped": sorted(skipped, key=lambda s: str(s["path"])),
    }


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
