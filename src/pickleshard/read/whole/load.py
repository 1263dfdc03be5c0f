"""Whole-file mode: unpickle a file at once and classify what went wrong.

Decoded files are cached by :mod:`pickleshard.read.whole.cache`.

This is the fallback path for files that cannot be span-indexed, and the reference the span
reader is tested against.
"""

from __future__ import annotations

import os
import pickle
from typing import IO, Any

from ...errors import (
    CorruptPickleError,
    EmptyPickleError,
    FileChangedError,
    NotAPickleError,
    PickleshardError,
    TruncatedPickleError,
    UnreadableFileError,
)
from ...io import ByteSource, open_reader, open_source
from ...io.identity import FileIdentity
from ...io.options import SourceOptions
from ...picklekit.archives import HEAD_BYTES, torch_save_kind, torch_save_message
from ...picklekit.gcpause import paused_gc
from ...picklekit.preload import check_before_load
from ...producers.foreign import foreign_records, unwrap_tables
from ...producers.python2 import is_python2_str, python2_error
from ...safety.policy import DEFAULT_POLICY, UnpicklePolicy, guard_misuse
from ...scan.layouts import DecodedLayout, LayoutChoice
from ...scan.records import decode_records

__all__ = [
    "load_file",
    "load_layout",
    "load_records",
]

_PROTO = 0x80
_UNFRAMED_OPENERS = (b"(", b"]", b"}", b")")  # MARK, EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE


def load_file(
    path: str | os.PathLike[str],
    policy: UnpicklePolicy = DEFAULT_POLICY,
    *,
    check_first: bool = False,
) -> Any:
    """Unpickle the first pickle of ``path``; every failure becomes a :class:`PickleshardError`.

    ``policy`` decides which globals may load (default: the allowlist) and the text encoding.
    A file may hold more pickles after it: :func:`load_records` reads them all.

    ``check_first=True`` first runs :func:`check_before_load` over each pickle, so that a memo id
    no pickle of this size can hold is refused before CPython's unpickler sizes its memo array
    to it (a ``LONG_BINPUT`` id near 2**32 asks for 64 GiB, and gets it where memory is
    overcommitted), and ints crafted to hash alike before a set or dict of them is built. It is off by default because it walks every opcode in Python: about 0.3x
    the load's time on a file of 12 KB arrays, 1.2-1.7x on small Python objects (measured on
    40,000 samples of each). Index building turns it on,
    so a file an index holds has been checked (and the index's staleness check says it has not
    changed since).
    """
    return _load(path, policy, every=False, check_first=check_first)[0]


def load_records(
    path: str | os.PathLike[str],
    policy: UnpicklePolicy = DEFAULT_POLICY,
    *,
    check_first: bool = False,
    identity: FileIdentity | None = None,
    options: SourceOptions | None = None,
) -> list[Any]:
    """Every pickle of ``path`` (opened with ``options``) in file order (one per
    ``pickle.dump`` call that wrote it); ``check_first`` as in :func:`load_file`. With ``identity`` (what the index recorded), the
    open file is compared with it before and after the load (``fstat``): a file changed since
    it was indexed, or while it was read, raises :class:`FileChangedError` instead of giving
    samples that are neither the old nor the new data."""
    return _load(
        path, policy, every=True, check_first=check_first, identity=identity, options=options
    )


def _load(
    path: str | os.PathLike[str],
    policy: UnpicklePolicy,
    *,
    every: bool,
    check_first: bool,
    identity: FileIdentity | None = None,
    options: SourceOptions | None = None,
) -> list[Any]:
    where = os.fspath(path)
    with open_source(where, options) as source:
        # UnreadableFileError "cannot open"/"cannot read" itself
        head = source.read_at(0, HEAD_BYTES)
        size = source.size
        if identity is not None:
            _check_identity(source, where, identity, "")
        if not head:
            raise EmptyPickleError(where, "file is empty; expected a pickle stream", offset=0)
        torch_save = torch_save_kind(head)  # would fail deep inside, on a persistent id
        if torch_save is not None:
            raise NotAPickleError(where, torch_save_message(torch_save), offset=0)
        source.advise("sequential")  # the unpickler reads every byte, in order
        buf = _map(source) if check_first else None
        with open_reader(source) as fh:
            records: list[Any] = []
            while True:
                if buf is not None:
                    check_before_load(buf, fh.tell(), size, where)
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
        with paused_gc():  # the load makes no cycles; collections during it cost more than it
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
        if isinstance(exc, UnicodeDecodeError) and is_python2_str(exc):  # say what to pass
            raise python2_error(where, exc, policy.encoding, offset=start) from None
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
    check_first: bool = False,
    identity: FileIdentity | None = None,
    layout: LayoutChoice = "auto",
    options: SourceOptions | None = None,
) -> DecodedLayout:
    """Unpickle every pickle of ``path`` and return its samples as columns, read as ``layout``
    says (see :func:`pickleshard.scan.records.decode_records`: one pickle, or several appended
    ones); ``check_first``, ``identity`` and ``options`` as in :func:`load_records`."""
    records = foreign_records(path, policy, identity, options)  # joblib.dump files, by bytes
    if records is None:
        records = load_records(
            path, policy, check_first=check_first, identity=identity, options=options
        )
    return decode_records(unwrap_tables(records, path), path, layout)  # DataFrame/Series: rows
