"""Indexing one pickle file: what a build's per-file work finds, run wherever the executor runs it.

:func:`describe_file` scans the file with :func:`pickleshard.scan.scan_file` (opcodes only;
then, to size its object fields, up to 32 samples read by span under the policy, as a read
would) and saves the per-sample span arrays into a staging folder as ``.npy``; a file
the scanner refuses (:class:`~pickleshard.errors.NotSpanIndexableError`: protocol 0/1, a layout
it cannot prove...) is unpickled whole to count its samples instead, and its row says why
(``mode="whole"``, ``reason``). The scanner's other errors are checked against a whole-file
load, so a bad file raises the same :class:`~pickleshard.errors.PickleshardError` either way.
Either way a memo id larger than the file is refused
(:func:`pickleshard.picklekit.preload.check_before_load`), so that no file an index holds makes a later
whole-file load allocate a huge memo. The file's identity, fingerprint and memo check read it
through :mod:`pickleshard.io`; the fingerprint is read after the scan, so that a remote object
the scan downloaded whole gives its blocks with no request
(:meth:`~pickleshard.io.remote.source.FsspecSource.hold_whole`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import NotSpanIndexableError, PickleshardError
from ..index.files import FileEntry, fingerprint
from ..io import ByteSource, open_source
from ..io.options import SourceOptions
from ..io.remote.counting import remote_fetch_counts
from ..io.remote.source import FsspecSource
from ..picklekit.memotables import sorted_unique
from ..picklekit.preload import check_before_load
from ..producers.foreign import foreign_scan
from ..read import SpanReader
from ..read.whole.cache import estimate_nbytes
from ..read.whole.load import load_layout
from ..safety.policy import DEFAULT_POLICY, UnpicklePolicy
from ..scan import ArrayItem, IntItem, ScanResult, scan_file
from ..scan.ambiguity import Ambiguity
from ..scan.filemeta import metadata_to_json
from ..scan.layouts import LayoutChoice
from .openaudit import AUDIT_OPCODE_BYTES, buffer_globals

__all__ = ["Described", "describe_file", "staged_name"]

_OBJECT_OVERHEAD = 64  # bytes per element beyond its pickled size, when none could be read
_SIZED = 32  # samples read per file to size its object fields
_ARRAY_OVERHEAD = 112  # an ndarray's header
_INT_SLOT = 8 + 28  # a list slot and an int below 2**30 (sys.getsizeof), as estimate_nbytes counts
_SIZED_SPAN_MAX = 64 << 10  # object bytes of one sample read to size a file, at most
_KEPT_MAX = 8 << 20  # span-array bytes of one file kept in memory for the write, at most


@dataclass(frozen=True)
class Described:
    """What a worker returns for one file: its row, and the lengths of its staged arrays."""

    entry: FileEntry
    ext_keys: int = 0
    records: int = 0
    # every global the file names, with its first offset, when the scan could say (else None:
    # the dataset's audit walks the file itself)
    globals: dict[tuple[str, str], int] | None = None
    # the span arrays themselves, when the file was described in the process that writes the
    # index (no staging round trip: saved, read back and checksummed again); else None
    arrays: dict[str, np.ndarray] | None = field(default=None, compare=False, repr=False)


def staged_name(staging: Path, pos: int, array: str) -> Path:
    """Where the worker indexing file ``pos`` saves span array ``array``."""
    return staging / f"{pos}.{array}.npy"


def _estimate(scan: ScanResult, source: ByteSource, policy: UnpicklePolicy) -> int:
    """Decoded bytes of a scanned file: array rows exactly, array items by their spans, int
    items by their count (nothing read for any of these); any other field by its span bytes times the decoded-per-pickled-byte ratio of up to
    :data:`_SIZED` samples spread over the file, read by span under ``policy``, as
    :func:`~pickleshard.read.whole.cache.estimate_nbytes`
    measures a whole file. Pickled size alone undercounts small Python objects 4-5x (a 3-byte
    BININT2 is a 28-byte int and a list slot), and the whole-file cache and
    :class:`~pickleshard.samplers.BlockShuffleSampler` budget by this number. When a sample
    cannot be read (its read will name why), the pickled size plus :data:`_OBJECT_OVERHEAD`
    per element stands in."""
    n = scan.num_samples
    total = 0
    spans = np.asarray(scan.ends, np.int64) - np.asarray(scan.starts, np.int64)
    objects = []
    for f, row in enumerate(scan.arrays):
        if row is not None:
            total += n * (row.nbytes + _ARRAY_OVERHEAD)
        elif f < len(scan.items) and isinstance(scan.items[f], ArrayItem):
            total += int(spans[:, f].sum()) + n * _ARRAY_OVERHEAD  # arrays: their payloads
        elif f < len(scan.items) and isinstance(scan.items[f], IntItem):
            total += n * _INT_SLOT  # each a BININT* opcode: an int below 2**31, known unread
        elif n:
            objects.append(f)
    if not objects:
        return total
    picked = sorted_unique(np.linspace(0, n - 1, min(n, _SIZED)).astype(np.int64))[0]
    # a big sample is never built to size it (a set of 150,000 ints that hash alike takes
    # minutes to build): its pickled size stands in
    picked = picked[spans[picked][:, objects].sum(axis=1) <= _SIZED_SPAN_MAX]
    decoded = _decoded_sizes(scan, source, policy, picked, objects) if len(picked) else None
    for f in objects:
        pickled = int(spans[:, f].sum())
        sampled = int(spans[picked, f].sum())
        if decoded is None or sampled <= 0:
            total += pickled + n * _OBJECT_OVERHEAD
        else:
            total += int(decoded[f] / sampled * pickled)  # the column's list slots included
    return total


def _decoded_sizes(
    scan: ScanResult,
    source: ByteSource,
    policy: UnpicklePolicy,
    picked: np.ndarray,
    fields: list[int],
) -> dict[int, int] | None:
    """Per field of ``fields``: :func:`~pickleshard.read.whole.cache.estimate_nbytes` of the column of
    its values in samples ``picked`` (a list, as a whole-file load holds them, so values the
    samples share count once, as they do there); only those fields' spans read, through
    ``source`` (left open; a remote object's ranges requested together). None when one cannot
    be read under ``policy``."""
    reader = SpanReader(
        scan, encoding=policy.encoding, find_class=policy.find_class(scan.path), source=source
    )
    starts = np.asarray(scan.starts, np.int64)[picked][:, fields]
    ends = np.asarray(scan.ends, np.int64)[picked][:, fields]
    columns: dict[int, list[Any]] = {f: [] for f in fields}
    try:
        lengths = (ends - starts).ravel().tolist()
        source.prefetch(list(zip(starts.ravel().tolist(), lengths, strict=True)))
        for i, row in zip(picked.tolist(), starts.tolist(), strict=True):
            for f, start in zip(fields, row, strict=True):
                columns[f].append(reader.spans.one(i, f, start, i, None))
    except PickleshardError:
        return None
    return {f: estimate_nbytes(column) for f, column in columns.items()}


def _check_span_memo(scan: ScanResult, options: SourceOptions | None) -> None:
    """Refuse a span-indexed file with a memo id above its size, as a whole-file load would.

    The scanner numbers each pickle's memo ids from its first one, consecutively, and records
    ``shift`` = memo key - memo id. The first key of a pickle is at most its start offset and
    it defines at most ``end - start`` entries, so its ids stay below ``end - shift``: only a
    pickle where that bound passes the file size is walked again, by :func:`check_before_load`,
    which names the opcode. A file written by ``pickle.dump`` is never walked again.
    """
    suspect = [int(start) for start, end, shift in scan.records if end - shift - 1 > scan.size]
    if not suspect:
        return
    # a walk over opcodes that skips payloads: the mapping of a source advised as usual
    with open_source(scan.path, options) as source:
        buf = source.map()
        if buf is None:  # a remote object (this check is rare): its bytes
            buf = source.read_at(0, source.size)
        for start in suspect:
            check_before_load(buf, start, source.size, scan.path)


def _found(metadata: dict[str, Any], ambiguity: Ambiguity | None) -> dict[str, Any]:
    """The files-table columns of a file's metadata and ambiguity (None when it has none)."""
    return {
        "metadata": metadata_to_json(metadata) if metadata else None,
        "ambiguity": ambiguity.to_json() if ambiguity else None,
    }


def _whole(
    path: str,
    base: dict[str, Any],
    policy: UnpicklePolicy,
    reason: str,
    layout: LayoutChoice,
    options: SourceOptions | None,
) -> Described:
    decoded = load_layout(path, policy, check_first=True, layout=layout, options=options)
    entry = FileEntry(
        **base,
        **_found(decoded.metadata, decoded.ambiguity),
        num_samples=decoded.num_samples,
        decoded_nbytes=estimate_nbytes(decoded.columns),
        layout=decoded.layout,
        fields=decoded.fields,
        mode="whole",
        reason=reason,
    )
    return Described(entry)


def describe_file(
    root: str,
    rel: str,
    pos: int,
    staging: Path | None,
    policy: UnpicklePolicy = DEFAULT_POLICY,
    layout: LayoutChoice = "auto",
    options: SourceOptions | None = None,
    in_memory: bool = False,
) -> Described:
    """Index file ``rel`` of ``root``, position ``pos`` in the files table, read as ``layout``
    (:data:`pickleshard.scan.layouts.LAYOUT_CHOICES`), opened with ``options`` (a URL's storage
    options: they come with the task, wherever the executor runs it).

    With a ``staging`` folder, the file is scanned and its span arrays saved there as
    ``{pos}.{name}.npy`` (``in_memory``: kept in :attr:`Described.arrays` instead, for a caller
    in the process that writes the index); without one (or when the scanner refuses it) it is
    unpickled whole.
    Raises the :class:`~pickleshard.errors.PickleshardError` that names a bad file.
    """
    path = os.path.join(root, rel)
    # one open for the identity and the fingerprint's 8 scattered blocks (hence "random")
    with open_source(path, options) as source:
        source.advise("random")
        source.fileno()  # the open's own error (identity() words it as a failed stat)
        now = source.identity()
        if isinstance(source, FsspecSource):
            source.hold_whole()  # a dense object's download then serves the fingerprint
        base: dict[str, Any] = {
            "path": rel,
            "size": now.size,
            "mtime_ns": now.mtime_ns,
            "ctime_ns": now.ctime_ns,
            "ino": now.ino,
            "fingerprint": "",  # below: after the scan, from what it fetched where it can
            **({} if now.etag is None else {"etag": now.etag}),  # remote objects only
        }
        if staging is None:
            why = "indexed without spans"
        else:  # scanned through the same open (for a remote object: no second sniff or stat)
            try:
                scan = foreign_scan(source, policy) or scan_file(
                    source, encoding=policy.encoding, layout=layout
                )
                why = ""
            except NotSpanIndexableError as exc:
                why = exc.reason
            except Exception as exc:  # the whole-file load below decides whether it is bad
                # A file the whole-file load reads is not bad: the scanner was stricter.
                why = f"the scanner failed: {type(exc).__name__}: {exc}"
        base["fingerprint"] = fingerprint(source)
        if not why and staging is not None:
            _check_span_memo(scan, options)
            nbytes = _estimate(scan, source, policy)  # reads a few samples through this open
            named = _globals(scan, source)
    if why or staging is None:
        return _whole(path, base, policy, why, layout, options)
    arrays = {name: np.ascontiguousarray(a) for name, a in scan.arrays_dict().items()}
    # kept for the write in this process when small (an inline build holds up to 16 files':
    # 128 MiB at most); else staged, so that the write holds one file's arrays at a time
    in_memory = in_memory and sum(a.nbytes for a in arrays.values()) <= _KEPT_MAX
    if not in_memory:
        for name, array in arrays.items():
            np.save(staged_name(staging, pos, name), array)
    entry = FileEntry(
        **base,
        **_found(scan.metadata, scan.ambiguity),
        num_samples=scan.num_samples,
        decoded_nbytes=nbytes,
        layout=scan.layout,
        fields=scan.fields,
        mode="span",
        scan={**scan.meta(), "num_records": len(scan.records), **_fetched(source)},
    )
    kept = arrays if in_memory else None
    return Described(entry, len(scan.ext_keys), len(scan.records), named, kept)


def _globals(scan: ScanResult, source: ByteSource) -> dict[tuple[str, str], int] | None:
    """The globals the file names, for the dataset's audit: none when the scan met no opcode
    naming one (nothing to walk); those the scan's walk listed when it could; else the audit's walk of the mapping the scan read (a local
    file, up to the audit's size limit); None for a remote object (its audit is the reads')."""
    if scan.global_ops == 0:
        return {}
    if scan.named_globals is not None:  # the scan's walk listed them (safety.audit.named)
        return scan.named_globals
    buf = source.map() if scan.global_ops > 0 and scan.bytes_read <= AUDIT_OPCODE_BYTES else None
    if buf is None:
        return None
    try:
        return buffer_globals(buf, source.size, scan.path)
    except PickleshardError:  # as file_globals: the dataset's audit and the reads word it
        return None


def _fetched(source: Any) -> dict[str, int | float]:
    """What a remote source's requests fetched, as the index keeps it: counts only (the wait
    varies from build to build; ``index --json`` reports the build's time)."""
    counts = remote_fetch_counts(source)
    counts.pop("fetch_seconds", None)
    return counts
