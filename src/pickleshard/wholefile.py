"""Whole-file mode: unpickle a file at once, classify what went wrong, and cache decoded files.

This is the fallback path for files that cannot be span-indexed, and the reference the span
reader is tested against.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from .errors import (
    CorruptPickleError,
    EmptyPickleError,
    FileChangedError,
    NotAPickleError,
    PickleshardError,
    TruncatedPickleError,
    UnreadableFileError,
)
from .fileidentity import FileIdentity
from .io import ByteSource, open_reader, open_source
from .layouts import DecodedLayout, decode_records
from .opcodes import (
    A_PUT,
    ACTION,
    ARGLEN,
    F_FIXED,
    F_LEN1,
    F_LEN4S,
    F_LEN4U,
    F_LEN8U,
    F_LINE,
    F_LINE2,
    FORM,
    OPNAME,
    STOP_OP,
)
from .safety import DEFAULT_POLICY, UnpicklePolicy, guard_misuse

__all__ = [
    "CacheStats",
    "WholeFileCache",
    "check_memo_ids",
    "estimate_nbytes",
    "load_file",
    "load_layout",
    "load_records",
]

_PROTO = 0x80
_UNFRAMED_OPENERS = (b"(", b"]", b"}", b")")  # MARK, EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE
_SAMPLE = 64
_ARRAY_HEADER = 112
_PUT, _BINPUT, _LONG_BINPUT = 0x70, 0x71, 0x72
# Size of each fixed-size opcode the memo check steps over unread (not a PUT, not STOP), else 0.
_STEP = [
    1 + ARGLEN[b] if FORM[b] == F_FIXED and ACTION[b] != A_PUT and b != STOP_OP else 0
    for b in range(256)
]
_U4, _I4, _U8 = (struct.Struct(f).unpack_from for f in ("<I", "<i", "<Q"))


def load_file(
    path: str | os.PathLike[str],
    policy: UnpicklePolicy = DEFAULT_POLICY,
    *,
    check_memo: bool = False,
) -> Any:
    """Unpickle the first pickle of ``path``; every failure becomes a :class:`PickleshardError`.

    ``policy`` decides which globals may load (default: the allowlist) and the text encoding.
    A file may hold more pickles after it: :func:`load_records` reads them all.

    ``check_memo=True`` first runs :func:`check_memo_ids` over each pickle, so that a memo id
    no pickle of this size can hold is refused before CPython's unpickler sizes its memo array
    to it (a ``LONG_BINPUT`` id near 2**32 asks for 64 GiB, and gets it where memory is
    overcommitted). It is off by default because it walks every opcode in Python: about 0.3x
    the load's time on a file of 12 KB arrays, 1.2-1.7x on small Python objects (measured on
    40,000 samples of each). Index building turns it on,
    so a file an index holds has been checked (and the index's staleness check says it has not
    changed since).
    """
    return _load(path, policy, every=False, check_memo=check_memo)[0]


def load_records(
    path: str | os.PathLike[str],
    policy: UnpicklePolicy = DEFAULT_POLICY,
    *,
    check_memo: bool = False,
    identity: FileIdentity | None = None,
) -> list[Any]:
    """Every pickle of ``path`` in file order (one per ``pickle.dump`` call that wrote it);
    ``check_memo`` as in :func:`load_file`. With ``identity`` (what the index recorded), the
    open file is compared with it before and after the load (``fstat``): a file changed since
    it was indexed, or while it was read, raises :class:`FileChangedError` instead of giving
    samples that are neither the old nor the new data."""
    return _load(path, policy, every=True, check_memo=check_memo, identity=identity)


def check_memo_ids(buf: Any, pos: int, size: int, name: str) -> int:
    """Refuse a memo id that cannot be legitimate in the pickle starting at ``buf[pos]``.

    ``buf`` holds the whole ``size``-byte file (bytes or mmap). A pickle of ``size`` bytes
    defines at most ``size`` memo entries, so a ``PUT``, ``BINPUT`` or ``LONG_BINPUT`` id above
    ``size`` is corrupt: raises :class:`CorruptPickleError` naming ``name``, the opcode's offset,
    the id and the limit; a payload length past the end of the file raises
    :class:`TruncatedPickleError` the same way. The walk steps over fixed-size opcodes and payloads, reading only
    opcode bytes, lengths and memo ids. Returns the offset just after the pickle's STOP, or
    the offset of the first opcode it cannot read (unknown, or running past the end): what is
    wrong there is the unpickler's to report, with the same error it always gave.
    """
    step_of, form_of = _STEP, FORM
    try:
        while pos < size:
            op = buf[pos]
            step = step_of[op]
            if step:
                pos += step
                continue
            form = form_of[op]
            if op == STOP_OP:
                return pos + 1
            if form == F_LEN1:
                pos += 2 + buf[pos + 1]
            elif form == F_LEN4U:
                pos = _payload_end(buf, pos, 5, _U4(buf, pos + 1)[0], size, name)
            elif form == F_LEN8U:
                pos = _payload_end(buf, pos, 9, _U8(buf, pos + 1)[0], size, name)
            elif form == F_LEN4S:
                n = _I4(buf, pos + 1)[0]
                if n < 0:
                    return pos
                pos = _payload_end(buf, pos, 5, n, size, name)
            elif op == _BINPUT:
                _check_id(buf[pos + 1], pos, size, name)
                pos += 2
            elif op == _LONG_BINPUT:
                _check_id(_U4(buf, pos + 1)[0], pos, size, name)
                pos += 5
            elif form in (F_LINE, F_LINE2):
                nl = buf.find(b"\n", pos + 1)
                if nl < 0:
                    return pos
                if op == _PUT:
                    try:
                        mid = int(buf[pos + 1 : nl])
                    except ValueError:
                        return pos
                    _check_id(mid, pos, size, name)
                if form == F_LINE2:
                    nl = buf.find(b"\n", nl + 1)
                    if nl < 0:
                        return pos
                pos = nl + 1
            else:
                return pos
    except (IndexError, struct.error):  # an argument runs past the end
        return pos
    return pos


def _payload_end(buf: Any, pos: int, header: int, n: int, size: int, name: str) -> int:
    """The end of the ``n``-byte payload of the opcode at ``pos``; refuse one the file cannot
    hold before the unpickler allocates it (CPython sizes a BYTEARRAY8 to the declared length,
    and a failed allocation of 2**62 bytes also prints a stray ``SystemError`` traceback)."""
    if n > size - pos - header:
        raise TruncatedPickleError(
            name,
            f"{OPNAME[buf[pos]]} declares a {n:,}-byte payload, but only {size - pos - header:,} "
            "bytes of the file are left; refused before unpickling allocates it",
            offset=pos,
        )
    return pos + header + n


def _check_id(mid: int, pos: int, size: int, name: str) -> None:
    if mid > size:
        raise CorruptPickleError(
            name,
            f"memo id {mid} is larger than the file ({size} bytes), which can define at most "
            f"{size} memo entries; refused before unpickling sizes its memo to it",
            offset=pos,
        )


def _load(
    path: str | os.PathLike[str],
    policy: UnpicklePolicy,
    *,
    every: bool,
    check_memo: bool,
    identity: FileIdentity | None = None,
) -> list[Any]:
    where = os.fspath(path)
    with open_source(where) as source:
        head = source.read_at(0, 2)  # UnreadableFileError "cannot open"/"cannot read" itself
        size = source.size
        if identity is not None:
            _check_identity(source, where, identity, "")
        if not head:
            raise EmptyPickleError(where, "file is empty; expected a pickle stream", offset=0)
        source.advise("sequential")  # the unpickler reads every byte, in order
        buf = _map(source) if check_memo else None
        with open_reader(source) as fh:
            records: list[Any] = []
            while True:
                if buf is not None:
                    check_memo_ids(buf, fh.tell(), size, where)
                records.append(_load_one(fh, where, size, policy))
                if not every or fh.tell() >= size:
                    if identity is not None:  # a write that raced the load has stamped it
                        _check_identity(source, where, identity, " (it changed while it was read)")
                    return records


def _check_identity(source: ByteSource, where: str, identity: FileIdentity, when: str) -> None:
    what = source.changed_since(identity)  # UnreadableFileError "cannot stat" itself
    if what is not None:
        # FileChangedError's message says "the file changed since it was indexed" itself
        raise FileChangedError(where, f"{what}{when}")


def _map(source: ByteSource) -> Any:
    """The whole file as a buffer (its map; its bytes where it cannot be mapped)."""
    buf = source.map()
    return source.read_at(0, source.size) if buf is None else buf


def _load_one(fh: IO[bytes], where: str, size: int, policy: UnpicklePolicy) -> Any:
    """The pickle starting at ``fh``'s position; leaves ``fh`` just after its STOP."""
    start = fh.tell()
    head = fh.read(2)
    framed = head[:1] == bytes((_PROTO,))
    if framed and len(head) < 2:
        raise TruncatedPickleError(where, "stream ends inside its PROTO opcode", offset=start + 1)
    if framed and head[1] > pickle.HIGHEST_PROTOCOL:
        raise NotAPickleError(
            where, f"PROTO opcode names unknown protocol {head[1:2]!r}", offset=start + 1
        )
    fh.seek(start)
    try:
        return policy.unpickler(fh, where).load()
    except PickleshardError:
        raise
    except OSError as exc:  # the file's own read failed (EIO, ESTALE): not its bytes' fault
        raise UnreadableFileError(
            where, f"cannot read: {exc.strerror or exc}", offset=fh.tell()
        ) from None
    except MemoryError:
        raise CorruptPickleError(
            where,
            "a length or memo id in the pickle starting here needs more memory than is available",
            offset=start,
        ) from None
    except Exception as exc:  # the unpickler raises many types on bad bytes
        offset = fh.tell()
        misuse = guard_misuse(exc, where, None)
        if misuse is not None:
            raise misuse from None
        ran_out = isinstance(exc, EOFError) or "truncated" in str(exc)
        # Protocol 0-1 streams have no PROTO header; one that opens a container and runs out
        # of bytes is a cut-short pickle, anything else unframed is not a pickle at all.
        if not framed and not (ran_out and head[:1] in _UNFRAMED_OPENERS):
            what = "not a pickle stream" if start == 0 else f"bytes after pickle ending at {start}"
            raise NotAPickleError(
                where,
                f"{what} (protocol 0-5 expected): {type(exc).__name__}: {exc}",
                offset=start,
            ) from None
        if ran_out or offset >= size:
            raise TruncatedPickleError(
                where,
                f"stream ends before STOP ({size} bytes): {exc}",
                offset=min(offset, size),
            ) from None
        raise CorruptPickleError(where, f"{type(exc).__name__}: {exc}", offset=offset) from None


def load_layout(
    path: str | os.PathLike[str],
    policy: UnpicklePolicy = DEFAULT_POLICY,
    *,
    check_memo: bool = False,
    identity: FileIdentity | None = None,
) -> DecodedLayout:
    """Unpickle every pickle of ``path`` and return its samples as columns (see
    :func:`pickleshard.layouts.decode_records`: one pickle, or several appended ones);
    ``check_memo`` and ``identity`` as in :func:`load_records`."""
    records = load_records(path, policy, check_memo=check_memo, identity=identity)
    return decode_records(records, path)


def estimate_nbytes(obj: object, _depth: int = 0) -> int:
    """Estimate the memory an unpickled object holds, in bytes.

    Arrays count their ``nbytes`` plus the object header; containers count themselves and their
    items, extrapolating from the first 64 items when there are more. An estimate, not a
    measurement: it bounds the cache's accounting, not the allocator's.
    """
    if isinstance(obj, np.ndarray):
        # getsizeof leaves out data the array does not own (protocol 5 arrays view a buffer).
        return obj.nbytes + _ARRAY_HEADER
    if _depth > 6:
        return sys.getsizeof(obj)
    if isinstance(obj, (list, tuple)):
        n = len(obj)
        head = obj[:_SAMPLE]
        items = sum(estimate_nbytes(v, _depth + 1) for v in head)
        if n > len(head):
            items = items * n // len(head)
        return sys.getsizeof(obj) + items
    if isinstance(obj, dict):
        keys = list(obj)[:_SAMPLE]
        items = sum(
            estimate_nbytes(k, _depth + 1) + estimate_nbytes(obj[k], _depth + 1) for k in keys
        )
        if len(obj) > len(keys):
            items = items * len(obj) // len(keys)
        return sys.getsizeof(obj) + items
    return sys.getsizeof(obj)


@dataclass
class CacheStats:
    """Counters of a :class:`WholeFileCache`; ``loads`` counts files actually unpickled."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    evictions: int = 0
    bytes_used: int = 0
    peak_bytes: int = 0


class WholeFileCache:
    """LRU cache of decoded files bounded by a byte budget.

    Holds at most ``max_bytes`` of estimated decoded size (see :func:`estimate_nbytes`), except
    that a single file larger than the budget is still held alone while it is the most recent:
    resident bytes <= ``max(max_bytes, largest file)``. Before loading a file whose expected
    size is known, entries are evicted first, so the budget holds during the load too.

    One cache per process: a forked child (DataLoader worker) starts empty instead of touching
    the parent's objects, which would copy their pages. Thread-safe.
    """

    def __init__(self, max_bytes: int, loader: Callable[[str], DecodedLayout]) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._loader = loader
        self._entries: OrderedDict[str, tuple[DecodedLayout, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.stats = CacheStats()

    def _reset_after_fork(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._entries = OrderedDict()
            self._lock = threading.Lock()
            self.stats = CacheStats()

    def _evict_for(self, incoming: int) -> None:
        while self._entries and self.stats.bytes_used + incoming > self.max_bytes:
            _, (_, size) = self._entries.popitem(last=False)
            self.stats.bytes_used -= size
            self.stats.evictions += 1

    def get(self, path: str, expected_nbytes: int = 0) -> DecodedLayout:
        """Return the decoded file at ``path``, loading it (and evicting LRU entries) on a miss."""
        self._reset_after_fork()
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None:
                self._entries.move_to_end(path)
                self.stats.hits += 1
                return entry[0]
            self.stats.misses += 1
            self._evict_for(expected_nbytes)
            decoded = self._loader(path)
            size = expected_nbytes or estimate_nbytes(decoded.columns)
            self.stats.loads += 1
            self._evict_for(size)
            self._entries[path] = (decoded, size)
            self.stats.bytes_used += size
            self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes_used)
            return decoded

    def clear(self) -> None:
        self._reset_after_fork()
        with self._lock:
            self._entries.clear()
            self.stats.bytes_used = 0

    def __len__(self) -> int:
        return len(self._entries)
