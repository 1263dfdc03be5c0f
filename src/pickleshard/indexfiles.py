"""One row of the index's files table: what indexing one pickle file finds, and how it is found.

:func:`describe_file` runs in an index worker process. It scans the file with
:func:`pickleshard.scan.scan_file` (opcodes only, nothing unpickled) and saves the per-sample span
arrays into a staging folder as ``.npy``; a file the scanner refuses
(:class:`~pickleshard.errors.NotSpanIndexableError`: protocol 0/1, a layout it cannot prove...) is
unpickled whole to count its samples instead, and its row says why (``mode="whole"``,
``reason``). The scanner's other errors are checked against a whole-file load, so a bad file
raises the same :class:`~pickleshard.errors.PickleshardError` either way. Either way a memo id
larger than the file is refused (:func:`pickleshard.picklekit.memoids.check_memo_ids`), so that no
file an index holds makes a later whole-file load allocate a huge memo.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .errors import NotSpanIndexableError, UnreadableFileError
from .fileidentity import FileIdentity
from .opcodes import open_buffer
from .picklekit.memoids import check_memo_ids
from .safety import DEFAULT_POLICY, UnpicklePolicy
from .scan import ScanResult, scan_file
from .wholefile import estimate_nbytes, load_layout

__all__ = ["SPAN_ARRAYS", "Described", "FileEntry", "describe_file", "fingerprint"]

# The span arrays of the index, each concatenated over the span-indexed files in file order.
SPAN_ARRAYS = ("starts", "ends", "memo_base", "ext_offsets", "ext_keys", "records")
Mode = Literal["span", "whole"]
_FINGERPRINT_BLOCK = 4096
_FINGERPRINT_BLOCKS = 8
_OBJECT_OVERHEAD = 64  # bytes per unpickled element beyond its pickled size (estimate)
_ARRAY_OVERHEAD = 112  # an ndarray's header


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
    """One row of the files table. ``path`` is relative to the dataset root.

    ``mode`` is ``"span"`` when the file's samples are read in place (``scan`` holds
    :meth:`ScanResult.meta`, and its rows of the span arrays start at ``span_row``,
    ``ext_row`` and ``record_row``) or ``"whole"`` when the file is unpickled whole (``reason``
    says why). ``decoded_nbytes`` is the file's decoded size: measured for whole files,
    estimated from the span sizes for span files. ``ctime_ns`` and ``ino`` are the file's
    ``st_ctime_ns`` and ``st_ino`` when indexed; None in rows written before they were stored
    (the staleness check then rests on size, mtime and fingerprint alone).
    """

    path: str
    size: int
    mtime_ns: int
    fingerprint: str
    num_samples: int
    decoded_nbytes: int
    layout: str
    fields: tuple[str, ...]
    mode: Mode = "whole"
    reason: str | None = None
    scan: dict[str, Any] | None = None
    span_row: int = -1
    ext_row: int = -1
    record_row: int = -1
    ctime_ns: int | None = None
    ino: int | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FileEntry:
        return cls(**{**obj, "fields": tuple(obj["fields"])})

    @property
    def identity(self) -> FileIdentity:
        """What the file must still be for a read that relies on this row (span or whole)."""
        return FileIdentity(self.size, self.mtime_ns, self.ctime_ns, self.ino)


@dataclass(frozen=True)
class Described:
    """What a worker returns for one file: its row, and the lengths of its staged arrays."""

    entry: FileEntry
    ext_keys: int = 0
    records: int = 0


def staged_name(staging: Path, pos: int, array: str) -> Path:
    return staging / f"{pos}.{array}.npy"


def _estimate(scan: ScanResult) -> int:
    """Decoded bytes of a scanned file: array rows exactly, pickled elements by span size."""
    n = scan.num_samples
    total = 0
    for f, row in enumerate(scan.arrays):
        if row is not None:
            total += n * (row.nbytes + _ARRAY_OVERHEAD)
        elif n:
            total += int((scan.ends[:, f] - scan.starts[:, f]).sum()) + n * _OBJECT_OVERHEAD
    return total


def _check_span_memo(scan: ScanResult) -> None:
    """Refuse a span-indexed file with a memo id above its size, as a whole-file load would.

    The scanner numbers each pickle's memo ids from its first one, consecutively, and records
    ``shift`` = memo key - memo id. The first key of a pickle is at most its start offset and
    it defines at most ``end - start`` entries, so its ids stay below ``end - shift``: only a
    pickle where that bound passes the file size is walked again, by :func:`check_memo_ids`,
    which names the opcode. A file written by ``pickle.dump`` is never walked again.
    """
    suspect = [int(start) for start, end, shift in scan.records if end - shift - 1 > scan.size]
    if not suspect:
        return
    buf, size = open_buffer(scan.path)
    try:
        for start in suspect:
            check_memo_ids(buf, start, size, scan.path)
    finally:
        if not isinstance(buf, bytes):
            buf.close()


def _whole(path: str, base: dict[str, Any], policy: UnpicklePolicy, reason: str) -> Described:
    decoded = load_layout(path, policy, check_memo=True)
    entry = FileEntry(
        **base,
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
) -> Described:
    """Index file ``rel`` of ``root``, position ``pos`` in the files table.

    With a ``staging`` folder, the file is scanned and its span arrays saved there as
    ``{pos}.{name}.npy``; without one (or when the scanner refuses it) it is unpickled whole.
    Raises the :class:`~pickleshard.errors.PickleshardError` that names a bad file.
    """
    path = os.path.join(root, rel)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise UnreadableFileError(path, f"cannot stat: {exc.strerror or exc}") from None
    base: dict[str, Any] = {
        "path": rel,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
        "fingerprint": fingerprint(path),
    }
    if staging is None:
        return _whole(path, base, policy, "indexed without spans")
    try:
        scan = scan_file(path, encoding=policy.encoding)
    except NotSpanIndexableError as exc:
        return _whole(path, base, policy, exc.reason)
    except Exception as exc:  # the whole-file load below decides whether the file is bad
        # A file the whole-file load reads is not bad: the scanner was stricter than pickle.
        return _whole(path, base, policy, f"the scanner failed: {type(exc).__name__}: {exc}")
    _check_span_memo(scan)
    for name, array in scan.arrays_dict().items():
        np.save(staged_name(staging, pos, name), np.ascontiguousarray(array))
    entry = FileEntry(
        **base,
        num_samples=scan.num_samples,
        decoded_nbytes=_estimate(scan),
        layout=scan.layout,
        fields=scan.fields,
        mode="span",
        scan={**scan.meta(), "num_records": len(scan.records)},
    )
    return Described(entry, ext_keys=len(scan.ext_keys), records=len(scan.records))
