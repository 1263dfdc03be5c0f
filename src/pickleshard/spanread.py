"""Read samples straight out of an unmodified pickle file, span by span.

:class:`SpanReader` reads sample ``i`` of a :class:`~pickleshard.scan.ScanResult` with
``os.pread``: an ``array_row`` field is read into a fresh array; so is a sample of a field whose
samples are numpy arrays of one dtype and shape (:class:`~pickleshard.scan.ArrayItem`: read
from the array's payload, the field checked once per process against a real unpickling of one
sample); a field of small ints (:class:`~pickleshard.scan.IntItem`) is decoded from its bytes; any
other ``pickle`` field is unpickled from its span alone, in one of two ways that give the same
value:

- *fast* (the default): the span is rewritten into a standalone pickle
  (:func:`pickleshard.picklekit.rewrite.rewrite_span`): ``PROTO p`` + a prologue that stores each
  external value at local memo ids ``0..k-1`` (by value when every one has a literal, see
  :func:`~pickleshard.picklekit.rewrite.literal_head`, else fed as persistent ids) + the span with
  FRAME headers dropped, PUT/GET renumbered to ``k + (key - memo_base)`` and external GETs
  pointed at the prologue's ids + ``STOP``, and read by the C unpickler, with the allowlist hook
  only if the span names a global. ``bytes``/``bytearray`` payloads of ``big`` bytes or more
  that were not already read are passed out of band (``NEXT_BUFFER``), read by ``pread``
  straight into their own buffer.
- *general*: :class:`pickleshard.memo.SpanUnpickler` reads the span as is (pure Python, slow,
  obviously right); the oracle for the fast path.

With the compiled extension, once a process has read a sample of the file (which settles how
each field is read), a sample whose fields are small ints, arrays read from their payloads and
at most one span with a cached literal prologue is read in one call into
``pickleshard._cscan.SpanLoader`` (the same reads, rewrite and load, in C), and batches of them
in one call too; anything else takes the Python path above, which is the reference.

Reads check what they rely on (see :class:`SpanReader`): an array read from its payload is read
in one ``preadv`` with the bytes around it, which must be the framing the scan proved; a small int
is decoded only from its opcode; and the file's identity (size, mtime, ctime, inode, as indexed)
is checked with ``fstat`` on open and after the reads of every call, so a write that raced a
read is caught before its samples are returned. A mismatch raises
:class:`~pickleshard.errors.FileChangedError` naming the file and the sample. What no check can
see: a file whose payload bytes alone changed while its size, mtime *and* ctime stayed (a clock
set back, a file system that does not keep them).

External values come from the file's :class:`~pickleshard.memo.SharedTable`: the element that
defines one is replayed whole, once per read (all its values then come from that one replay, so
identity between them holds). Immutable values (str, bytes, numbers, dtypes, classes and
functions, tuples of these) are kept in a per-reader cache of at most ``shared_bytes``; mutable
ones are rebuilt for every read, so mutating a sample never changes another. Within one
:meth:`SpanReader.read_sample` call, a field whose values a later field refers to is read first
and its objects are reused, so ``x is y``-style sharing within a sample survives.

:meth:`SpanReader._fast_unpickler` and :meth:`SpanReader._general_unpickler` build every
unpickler; ``find_class=`` (default: the allowlist of :mod:`pickleshard.safety`) replaces the
global lookup in both.
"""

from __future__ import annotations

import copyreg
import functools
import io
import os
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from .errors import (
    CorruptPickleError,
    FileChangedError,
    MemoIdError,
    PickleshardError,
    ReadMemoryError,
    TruncatedPickleError,
    UnreadableFileError,
)
from .fileidentity import FileIdentity
from .picklekit import opcodes as oc
from .picklekit.rewrite import (
    BIG,
    FindClass,
    HookedUnpickler,
    _compiled_rewrite,
    literal_head,
    rewrite_span,
)
from .picklekit.spanfile import SpanFile
from .picklekit.unpicklers import MemoIdPastSpan, SpanUnpickler
from .picklekit.walk import resolve_engine
from .safety import GUARD_TYPES, AllowlistFindClass, guard_misuse
from .scan import ArrayItem, IntItem, ScanResult

__all__ = ["BIG", "FileIdentity", "ReaderStats", "SpanReader", "literal_head", "rewrite_span"]

_SPAN, _ROW, _ITEM, _INT = range(4)  # how a field is read: see SpanReader.read_sample
_MAX_HEADS = 4096  # literal prologues kept per reader, one per distinct tuple of externals
BATCH_READ_MIN = 16  # samples of one file that read_samples reads as a batch (fewer: one by one)
_INT_REGION = 1 << 20  # an int field's values are decoded at once from at most this many bytes


@dataclass
class ReaderStats:
    """Counters of a :class:`SpanReader` (per process)."""

    fast_reads: int = 0
    general_reads: int = 0
    array_rows: int = 0
    array_items: int = 0  # samples of per-sample array fields read straight from their payload
    int_items: int = 0  # small ints decoded without an unpickler
    replays: int = 0
    shared_hits: int = 0
    shared_misses: int = 0
    shared_bytes: int = 0
    bytes_read: int = 0


_LEAVES = (str, bytes, int, float, complex, bool, type(None), range)
_CALLABLES: tuple[type, ...] = (type, types.FunctionType, types.BuiltinFunctionType)
_CALLABLES += (
    np.dtype,
    np.generic,
    *GUARD_TYPES,
)  # the allowlist's guards: immutable, one per global and reader


def _immutable(v: Any, depth: int = 0) -> bool:
    if type(v) in _LEAVES or isinstance(v, _CALLABLES):
        return True
    if type(v) in (tuple, frozenset):
        return depth < 8 and all(_immutable(x, depth + 1) for x in v)
    return False


_MISSING = object()
try:
    from ._cscan import SLOW as _SLOW  # the compiled lone-span read declined: read it here
except ImportError:  # no extension: no compiled reads either
    _SLOW = object()
Memos = dict[int, dict[int, Any]]  # per read: shared element -> {memo key: value}


class SpanReader:
    """Reads samples of one scanned file by span; one per file and process.

    ``encoding`` / ``errors`` are those of :func:`pickle.load` (``"latin1"`` or ``"bytes"`` for
    Python 2 pickles). ``find_class(module, name)`` replaces the global lookup of every
    unpickler this reader builds (:meth:`_fast_unpickler` and :meth:`_general_unpickler` are the
    only places they are built); by default (``"allowlist"``) it is the allowlist of
    :mod:`pickleshard.safety`, and ``None`` (a trusted file) is the plain lookup, which runs any
    callable the file names. ``general=True`` reads every pickle span with the
    pure-Python general path; ``engine`` picks the fast path's span rewrite, compiled or
    :func:`rewrite_span` (as :func:`pickleshard.scan.scan_file` picks its walker; the same
    pickles either way). Immutable shared values are cached up to ``shared_bytes``
    (``sys.getsizeof`` estimate, see :class:`ReaderStats`). The file descriptor is opened on
    first use and reopened after a fork; a pickled reader travels without it.

    Reads check what they rely on, and raise :class:`~pickleshard.errors.FileChangedError`
    naming the file and the sample when it no longer holds: an array read from its payload is
    read in one ``preadv`` with the bytes around it, which must be the framing the scan proved
    (:meth:`ArrayItem.framing_matches`); a small int's opcode is checked as it is decoded; and
    ``os.fstat`` of the file must match ``identity`` (default: the scanned size) when it is
    opened and after the reads of every :meth:`read_sample` and :meth:`read_samples` call, so a
    write that raced a read (the kernel stamps mtime and ctime before it copies the data) is
    caught before the samples are returned. ``verify=False`` turns both off; only the
    benchmark that measures their cost uses it.
    """

    def __init__(
        self,
        scan: ScanResult,
        *,
        encoding: str = "ASCII",
        errors: str = "strict",
        find_class: FindClass | Literal["allowlist"] | None = "allowlist",
        general: bool = False,
        shared_bytes: int = 64 << 20,
        big: int = BIG,
        engine: str = "auto",
        identity: FileIdentity | None = None,
        verify: bool = True,
    ) -> None:
        # plain ndarray views of the index's memory-mapped arrays: np.memmap's Python-level
        # __array_finalize__ runs on every slice of a memmap, several times per sample read
        self.scan = scan = replace(
            scan,
            starts=np.asarray(scan.starts),
            ends=np.asarray(scan.ends),
            memo_base=np.asarray(scan.memo_base),
            ext_offsets=np.asarray(scan.ext_offsets),
            ext_keys=np.asarray(scan.ext_keys),
            records=np.asarray(scan.records),
        )
        self.path = scan.path
        self.identity = identity if identity is not None else FileIdentity(scan.size)
        self.verify = verify
        self._own_allowlist: AllowlistFindClass | None = None
        if isinstance(find_class, str):  # restricted unless the caller says otherwise
            find_class = self._own_allowlist = AllowlistFindClass(scan.path)
        self.encoding, self.errors, self.find_class = encoding, errors, find_class
        self._plain = (encoding, errors) == ("ASCII", "strict")  # pickle.loads' own defaults
        self.general = general
        self.engine = resolve_engine(engine)
        self._rewrite = _compiled_rewrite() if self.engine == "compiled" else rewrite_span
        self.shared_budget = shared_bytes
        self.big = big
        self.stats = ReaderStats()
        self._shared: dict[int, Any] = {}
        self._heads: dict[tuple[int, ...], bytes | None] = {}
        self._definers = {s: j for j, (s, _, _, _) in enumerate(scan.shared.elements)}
        self._is_row = [k == "array_row" for k in scan.kinds]
        # per field: (ArrayItem, its exceptions) when its samples are read from their payloads
        # general=True reads every pickle field by span (the reference for the other paths)
        items = (None,) * len(scan.kinds) if general or not scan.items else scan.items
        self._items = [
            (it, frozenset(it.exceptions)) if isinstance(it, ArrayItem) else None for it in items
        ]
        self._is_int = [isinstance(it, IntItem) for it in items]
        self._how = [
            _ROW if row else _ITEM if it is not None else _INT if is_int else _SPAN
            for row, it, is_int in zip(self._is_row, self._items, self._is_int, strict=True)
        ]
        self._ints: dict[int, np.ndarray | None] = {}  # per int field: every value, or None
        self._framings: dict[int, Any] = {}  # per ArrayItem field: its _cscan.Framing
        self._checked: set[int] = set()  # ArrayItem fields checked against a real unpickling
        self._rec_starts = np.ascontiguousarray(scan.records[:, 0])
        self._one_shift = int(scan.records[0, 2]) if len(scan.records) == 1 else None
        self._n = scan.num_samples
        self._fd = -1
        self._pid = -1
        self._loader: Any = None  # the compiled reads (_cscan.SpanLoader), per process
        self._planned = False  # whether the loader was given a whole-sample plan (or refused)
        self._plan_span = -1  # the field the plan reads by span
        self._plan_ok = False  # the loader has a whole-sample plan
        self._plan_items = False  # ... that reads arrays from their payloads

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd, self._pid = -1, -1

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(
            _fd=-1,
            _pid=-1,
            _shared={},
            _heads={},
            _ints={},
            _framings={},
            stats=ReaderStats(),
            _loader=None,
            _planned=False,
            _plan_ok=False,
        )
        return state

    def _fileno(self) -> int:
        if self._pid != os.getpid():
            self._shared, self._heads, self._ints, self._fd = {}, {}, {}, -1
            try:
                self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise UnreadableFileError(
                    self.path, f"cannot open: {exc.strerror or exc}"
                ) from None
            self._pid = os.getpid()
            self._loader, self._planned, self._plan_ok = self._make_loader(), False, False
            if self.verify:  # a file replaced or rewritten since the scan is refused on open
                try:
                    self._check_opened()
                except PickleshardError:
                    self.close()  # and checked again on the next open
                    raise
        return self._fd

    def _check_opened(self) -> None:
        size = self._fstat().st_size
        if size < self.identity.size:  # as SpanFiles says it before it builds a reader
            raise TruncatedPickleError(
                self.path,
                f"file is {size} bytes, {self.identity.size} when indexed: cut short since",
                offset=size,
            )
        self._check_same(None)

    def read_raw(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset``, by this reader's descriptor (opened with the file's
        identity checked, as for any read): bytes used raw (an array row's) are checked after
        the reads by :meth:`check_identity`."""
        return self._read_at(offset, n)

    def check_identity(self, samples: Sequence[int]) -> None:
        """Raise :class:`FileChangedError` naming ``samples`` if the file is no longer the one
        indexed (``fstat``; nothing unless ``verify``): after raw reads, a write that raced
        them has stamped the file by now."""
        if self.verify:
            self._fileno()
            self._check_same(samples)

    def _check_same(self, samples: Sequence[int] | None) -> None:
        """Raise :class:`FileChangedError` if the open file is no longer the one indexed;
        ``samples`` (labels) are those just read, named in the error."""
        what = self.identity.differs(self._fstat())
        if what is not None:
            raise self._changed(what, None, samples)

    def _fstat(self) -> os.stat_result:
        try:
            return os.fstat(self._fd)
        except OSError as exc:  # ESTALE (a file replaced on NFS), EIO
            raise self._unreadable("stat", exc, None) from None

    def _unreadable(self, what: str, exc: OSError, offset: int | None) -> UnreadableFileError:
        """An I/O error of this reader's file: an :class:`UnreadableFileError` (not a corrupt
        span: the bytes were never read)."""
        return UnreadableFileError(
            self.path, f"cannot {what}: {exc.strerror or exc}", offset=offset
        )

    def _changed(self, what: str, offset: int | None, samples: Sequence[int] | None) -> Exception:
        """The error for a file found changed while reading ``samples``."""
        if samples is not None and len(samples) > 1:
            shown = ", ".join(map(str, samples[:8])) + (" ..." if len(samples) > 8 else "")
            what = f"{what} (after reading samples {shown})"
        sample = samples[0] if samples is not None and len(samples) == 1 else None
        return FileChangedError(self.path, what, offset=offset, sample=sample)

    def _make_loader(self) -> Any:
        """The compiled lone-span read over this process's caches, or None (pure engine,
        general reads, appended pickles, or span arrays that are not int64)."""
        scan = self.scan
        arrays = (scan.ends, scan.memo_base, scan.ext_offsets, scan.ext_keys)
        if (
            self.engine != "compiled"
            or self.general
            or self._one_shift is None
            or any(a.dtype != np.int64 for a in arrays)
        ):
            return None
        from ._cscan import SpanLoader

        loads = (
            pickle.loads
            if self._plain
            else functools.partial(pickle.loads, encoding=self.encoding, errors=self.errors)
        )
        hooked = None if self.find_class is None else self._hooked_load
        loader = SpanLoader(
            *arrays, self._heads, scan.protocol, self._one_shift, loads, hooked, self.stats
        )
        if self.verify:
            ident = self.identity
            got = (ident.mtime_ns, ident.ctime_ns, ident.ino)
            mtime, ctime, ino = (-1 if v is None else v for v in got)  # -1: not compared
            loader.identify(ident.size, mtime, ctime, ino, self._stale)
        return loader

    def _stale(self, what: str | None, offset: int, samples: list[int]) -> Exception:
        """The compiled reads' error for a changed file: ``what`` changed (None: its identity,
        described here), at ``offset`` (-1: none), while reading ``samples``."""
        if what is None:
            what = self.identity.differs(self._fstat()) or "its identity changed"
        return self._changed(what, offset if offset >= 0 else None, samples)

    def _plan(self) -> None:
        """Give the loader the whole-sample plan when every field is read the way it compiles:
        at most one by span, small ints with decoded values, arrays from their payloads
        (after their check). Once per process, after a first read has settled the fields."""
        self._planned = True
        hows: list[int] = []
        cols: list[int] = []
        items: list[tuple[Any, ...] | None] = []
        ints: list[np.ndarray] = []
        for f, how in enumerate(self._how):
            if how == _ITEM and f in self._checked:
                spec, exceptions = self._items[f]  # type: ignore[misc]
                try:  # the compiled read fills the array through the buffer protocol
                    memoryview(np.empty((0,), spec.dtype))  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    return
                nbytes = int(np.prod(spec.shape)) * spec.dtype.itemsize
                fields = (spec.shape, spec.dtype, spec.prefix, nbytes, spec.swap, spec.readonly)
                template = (
                    spec.head,
                    spec.tail,
                    _flat(spec.head_masked),
                    _flat(spec.tail_masked),
                    np.asarray(spec.bounds, np.int64),
                )
                items.append((*fields, exceptions, *template))
            elif how == _INT and (values := self._int_values(f)) is not None:
                ints.append(values)
                items.append(None)
            elif how == _SPAN:
                items.append(None)
            else:
                return
            cols.append(len(ints) - 1 if how == _INT else -1)
            hows.append(how)
        if sum(h == _SPAN for h in hows) > 1:
            return
        self._plan_span = hows.index(_SPAN) if _SPAN in hows else -1
        table = np.stack(ints, axis=1) if ints else np.zeros((self.scan.num_samples, 0), np.int64)
        labeler = self.find_class if isinstance(self.find_class, AllowlistFindClass) else None
        self._loader.plan(
            self.scan.starts,
            hows,
            table.astype(np.int64),
            cols,
            items,
            self._definers,
            np.empty,
            labeler,
        )
        self._plan_ok, self._plan_items = True, _ITEM in hows

    def _hooked_load(self, data: bytearray) -> Any:
        return self._fast_unpickler(data, [], []).load()

    def _read_at(self, offset: int, n: int) -> bytes:
        fd = self._fd if self._pid == os.getpid() else self._fileno()
        try:
            data = os.pread(fd, n, offset)
        except OSError as exc:
            raise self._unreadable("read", exc, offset) from None
        self.stats.bytes_read += len(data)
        return data

    def _preadv(self, fd: int, buffers: list[Any], offset: int) -> int:
        try:
            return os.preadv(fd, buffers, offset)
        except OSError as exc:
            raise self._unreadable("read", exc, offset) from None

    def _readinto_at(self, offset: int, view: memoryview) -> int:
        fd, got = self._fileno(), 0
        while got < len(view):
            k = self._preadv(fd, [view[got:]], offset + got)
            if k <= 0:
                break
            got += k
        self.stats.bytes_read += got
        return got

    def _payload(self, offset: int, n: int, kind: int) -> Any:
        if kind == oc.P_BYTES:
            data: Any = self._read_at(offset, n)
            ok = len(data) == n
        else:
            data = bytearray(n)
            ok = self._readinto_at(offset, memoryview(data)) == n
        if not ok:
            raise EOFError(f"file ends inside a {n}-byte payload at byte {offset}")
        return data

    # -- unpicklers: built here and nowhere else ------------------------------------------------

    def _fast_load(self, data: bytearray, objs: list[Any], buffers: list[Any], finds: int) -> Any:
        """Load a rewritten span: the global lookup is hooked only if the span names a global
        (``finds``); persistent ids only if the prologue uses them (``objs``)."""
        if objs or (finds and self.find_class is not None):
            return self._fast_unpickler(data, objs, buffers, hooked=finds > 0).load()
        if self._plain and not buffers:
            return pickle.loads(data)
        return pickle.loads(data, encoding=self.encoding, errors=self.errors, buffers=buffers)

    def _fast_unpickler(
        self, data: bytearray, objs: list[Any], buffers: list[Any], hooked: bool = True
    ) -> pickle.Unpickler:
        kwargs: dict[str, Any] = {
            "encoding": self.encoding,
            "errors": self.errors,
            "buffers": buffers,
        }
        if self.find_class is not None and hooked:
            copyreg.clear_extension_cache()  # else a cached EXT code never reaches find_class
        if self.find_class is None or not hooked:
            u = pickle.Unpickler(io.BytesIO(data), **kwargs)
        else:
            u = HookedUnpickler(io.BytesIO(data), self.find_class, **kwargs)
        if objs:
            u.persistent_load = objs.__getitem__  # type: ignore[method-assign]
        return u

    def _general_unpickler(
        self, start: int, end: int, first_id: int, resolve: Callable[[int], Any]
    ) -> SpanUnpickler:
        span = SpanFile(
            self._read_at, start, end, self.scan.protocol, readinto_at=self._readinto_at
        )
        if self.find_class is not None:
            copyreg.clear_extension_cache()  # else a cached EXT code never reaches find_class
        return SpanUnpickler(
            span,
            first_id=first_id,
            resolve=resolve,
            encoding=self.encoding,
            errors=self.errors,
            find_class=self.find_class,
        )

    # -- one span -------------------------------------------------------------------------------

    def _shift(self, start: int) -> int:
        return int(self.scan.records[int(np.searchsorted(self._rec_starts, start, "right")) - 1, 2])

    def _span(
        self,
        start: int,
        end: int,
        base: int,
        ext: list[int],
        memos: Memos,
        capture: int,
        *,
        literal: bool = True,
        name: int | None = None,
    ) -> Any:
        """Unpickle one span; if ``capture >= 0`` keep its memo as that of shared element ``capture``;
        errors name sample ``name``."""
        shift = self._one_shift if self._one_shift is not None else self._shift(start)
        memo: dict[int, Any] | None = None
        try:
            if self.general:
                self.stats.general_reads += 1
                u = self._general_unpickler(
                    start, end, base - shift, lambda i: self._external(i + shift, memos)
                )
                value = u.load()
                if capture >= 0:
                    memo = {i + shift: v for i, v in u.memo.items()}
            else:
                self.stats.fast_reads += 1
                head = self._literal_head(ext, memos) if capture < 0 and literal else None
                objs = [] if head is not None else [self._external(k, memos) for k in ext]
                data, buffers, finds = self._rewrite(
                    self._read_at,
                    start,
                    end,
                    self.scan.protocol,
                    base,
                    shift,
                    ext,
                    self._payload,
                    self.big,
                    head,
                )
                if capture < 0:
                    return self._fast_load(data, objs, buffers, finds)
                f = self._fast_unpickler(data, objs, buffers)
                value = f.load()
                n_ext = len(objs)
                memo = {base + i - n_ext: v for i, v in f.memo.copy().items() if i >= n_ext}
        except PickleshardError:
            raise
        except Exception as exc:  # bad bytes make the unpickler and numpy raise many types
            raise self._bad_span(start, exc, name) from None
        if memo is not None:
            memos[capture] = memo
        return value

    def _literal_head(self, ext: list[int], memos: Memos) -> bytes | None:
        """The literal prologue of these externals (see :func:`literal_head`), or None; cached
        per tuple of externals (their values never change: the file is the one scanned)."""
        key = tuple(ext)
        head = self._heads.get(key, _MISSING)
        if head is _MISSING:
            objs = [self._external(k, memos) for k in ext]
            head = literal_head(self.scan.protocol, objs, self.find_class)
            if len(self._heads) < _MAX_HEADS:
                self._heads[key] = head
        return head  # type: ignore[return-value]

    def _external(self, key: int, memos: Memos) -> Any:
        value = self._shared.get(key, _MISSING)
        if value is not _MISSING:
            self.stats.shared_hits += 1
            return value
        self.stats.shared_misses += 1
        e = self.scan.shared.element(key)
        memo = memos.get(e)
        if memo is None:
            self.stats.replays += 1
            start, end, base, ext = self.scan.shared.elements[e]
            self._span(start, end, base, list(ext), memos, e)
            memo = memos[e]
        value = memo[key]
        if _immutable(value):
            size = sys.getsizeof(value)
            if self.stats.shared_bytes + size <= self.shared_budget:
                self._shared[key] = value
                self.stats.shared_bytes += size
        return value

    # -- samples --------------------------------------------------------------------------------

    def _row(self, f: int, start: int, end: int) -> Any:
        spec = self.scan.arrays[f]
        assert spec is not None
        out = np.empty(spec.row_shape, spec.dtype)
        if self._readinto_at(start, memoryview(out.reshape(-1).view(np.uint8).data)) != end - start:
            raise TruncatedPickleError(self.path, "file ends inside an array row", offset=start)
        if spec.swap:
            out.byteswap(inplace=True)
        self.stats.array_rows += 1
        return out if out.ndim else out[()]

    def _check_item(self, f: int) -> bool:
        """Whether field ``f`` may be read from payloads in this process: the first time, one
        of its direct samples is also unpickled from its span (under this reader's policy) and
        must give the same array; if not (a damaged file the scan could not tell), every sample
        of the field is read by span from then on, so errors surface as they would there."""
        if f in self._checked:
            return self._how[f] == _ITEM
        spec, exceptions = self._items[f]  # type: ignore[misc]
        t = next(i for i in range(self.scan.num_samples) if i not in exceptions)
        scan = self.scan
        start, end = int(scan.starts[t, f]), int(scan.ends[t, f])
        ext = scan.externals(t, f)
        stats = replace(self.stats)
        settled = True
        try:
            base = int(scan.memo_base[t, f])
            want = self._span(start, end, base, ext.tolist(), {}, -1, name=t)
            got = self._item(spec, start, end, t)
            same = (
                type(want) is np.ndarray
                and want.dtype == got.dtype
                and want.dtype.byteorder == got.dtype.byteorder
                and want.shape == got.shape
                and want.flags.writeable == got.flags.writeable
                and want.tobytes() == got.tobytes()
            )
        except FileChangedError:  # not this field's fault: checked again on the next read
            settled = False
            raise
        except PickleshardError:
            same = False
        finally:
            vars(self.stats).update(vars(stats))  # the check is not a read of the caller's
            if settled and f not in self._checked:  # whatever the outcome, interruptions too
                self._checked.add(f)
                self._how[f], self._items[f] = _SPAN, None  # until proven the same
        if same:
            self._how[f], self._items[f] = _ITEM, (spec, exceptions)
        return same

    def _fill(
        self, fd: int, out: np.ndarray, spec: ArrayItem, start: int, end: int, label: int
    ) -> None:
        """Read the array item whose span is ``[start, end)`` into ``out``: its payload, and in
        the same ``preadv`` the bytes around it, which must be the framing the scan proved
        (else :class:`FileChangedError` naming sample ``label``)."""
        if not self.verify:  # the payload alone, as before the checks (the cost benchmark's)
            self._fill_payload(fd, out, start + spec.prefix, start)
            return
        head = bytearray(spec.prefix)
        after = end - start - spec.prefix - out.nbytes
        if not 0 <= after <= len(spec.tail) + 9:  # no framing of the template fits this span
            raise self._changed("its span does not fit the array's framing", start, [label])
        tail = bytearray(after)
        total = spec.prefix + out.nbytes + after
        got = self._preadv(fd, [head, out, tail], start)
        if got != total:  # a short read: the rest, or the file ended
            offset = start
            views: tuple[Any, ...] = (head, out.reshape(-1).view(np.uint8), tail)
            for view in views:
                n = len(view)
                if got < n and self._readinto_at(offset + got, memoryview(view)[got:]) != n - got:
                    raise TruncatedPickleError(self.path, "file ends inside an array", offset=start)
                offset, got = offset + n, max(got - n, 0)
        if self.verify and not spec.framing_matches(head, tail):
            raise self._changed(
                "the bytes around its array's payload (opcodes, dtype, shape, length) are not "
                "those indexed",
                start,
                [label],
            )

    def _fill_payload(self, fd: int, out: np.ndarray, offset: int, start: int) -> None:
        got = self._preadv(fd, [out], offset) if out.nbytes else 0
        if got != out.nbytes:  # a short read: the rest, or the file ended
            view = memoryview(out.reshape(-1).view(np.uint8).data)
            got += self._readinto_at(offset + got, view[got:])
            if got != out.nbytes:
                raise TruncatedPickleError(self.path, "file ends inside an array", offset=start)

    def _item(self, spec: ArrayItem, start: int, end: int, label: int) -> Any:
        out = np.empty(spec.shape, spec.dtype)
        fd = self._fd if self._pid == os.getpid() else self._fileno()
        self._fill(fd, out, spec, start, end, label)
        self.stats.bytes_read += out.nbytes
        if spec.swap:
            out.byteswap(inplace=True)
        if spec.readonly:
            out.flags.writeable = False
        self.stats.array_items += 1
        return out

    def _int_values(self, f: int) -> np.ndarray | None:
        values = self._ints.get(f, _MISSING)
        if values is _MISSING:
            values = self._ints[f] = self._decode_ints(f)
        return values  # type: ignore[return-value]

    def _int(self, f: int, i: int, start: int, label: int) -> int:
        values = self._int_values(f)
        if values is not None:
            return int(values[i])
        length = int(self.scan.ends[i, f]) - start
        data = self._read_at(start, min(max(length, 0), 14))
        op = data[0] if data else -1
        size = oc.INT_SPAN.get(op)
        if (
            size is None
            or len(data) != length
            or length not in (size, size + 9)
            or (length > size and data[size] != oc.FRAME_OP)
        ):
            raise self._changed("expected a small int here", start, [label])
        self.stats.int_items += 1
        return int.from_bytes(data[1:size], "little", signed=op == oc.BININT_OP)

    def _decode_ints(self, f: int) -> np.ndarray | None:
        """Every value of int field ``f``, decoded from one read of the bytes that hold them;
        None when those bytes are spread over too much of the file (then read one by one)."""
        st, en = self.scan.starts[:, f], self.scan.ends[:, f]
        lo, hi = int(st.min()), int(en.max())
        if hi - lo > min(_INT_REGION, 16 * int((en - st).sum())):
            return None
        region = self._read_at(lo, hi - lo) + bytes(4)
        if len(region) != hi - lo + 4:
            raise TruncatedPickleError(self.path, "file ends inside an int field", offset=lo)
        u8 = np.frombuffer(region, np.uint8)
        at = st - lo
        ops = u8[at]
        b = [u8[at + k].astype(np.int64) for k in (1, 2, 3, 4)]
        small = np.where(ops == oc.BININT1_OP, b[0], b[0] | (b[1] << 8))
        framed = np.flatnonzero(en - st > 5)  # an int and a FRAME header after it, as scanned
        full = (b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)).astype(np.uint32).view(np.int32)
        span = oc.INT_SPAN
        size = np.select([ops == op for op in span], list(span.values()), 0)
        length = en - st  # one opcode, maybe a FRAME header after it (as the scan found)
        if not (((length == size) | (length == size + 9)) & (size > 0)).all() or (
            len(framed) and (u8[at[framed] + size[framed]] != oc.FRAME_OP).any()
        ):
            raise self._changed("expected small ints in a field", lo, None)
        self.stats.int_items += len(st)
        values: np.ndarray = np.where(ops == oc.BININT_OP, full.astype(np.int64), small)
        return values

    def read_sample(self, i: int) -> tuple[Any, ...]:
        """Sample ``i`` as a tuple with one value per field, equal to the whole-file reading.

        Fields read by span are read in file order; one that a later field refers to is reused
        by it (and is never read straight from its payload, which would lose that identity).
        """
        return self._sample(i, None, self.verify)

    def _sample(self, i: int, label: int | None, check: bool = False) -> tuple[Any, ...]:
        """:meth:`read_sample`; a refusal by this reader's own allowlist names ``label``
        (default: ``i``); ``check``: compare the file's identity after the reads (else the
        caller does, once for its batch)."""
        n = self._n
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {self.path} ({n} samples)")
        if i < 0:
            i += n
        if self._own_allowlist is not None:
            self._own_allowlist.sample = i if label is None else label
        if self._loader is not None and self._pid == os.getpid() and type(i) is int:
            try:
                got = self._loader.load_sample(self._fd, i, check, label)
            except PickleshardError:
                raise
            except Exception as exc:  # bad bytes make the unpickler raise many types
                if self._plan_span < 0:  # only the span can meet bad bytes
                    raise
                start = int(self.scan.starts[i, self._plan_span])
                raise self._bad_span(start, exc, i if label is None else label) from None
            if got is not _SLOW:
                return got  # type: ignore[no-any-return]
        scan = self.scan
        starts = scan.starts[i].tolist()
        out: list[Any] = [None] * len(starts)
        spans: list[int] = []
        for f, how in enumerate(self._how):
            s = starts[f]
            if how == _ITEM and (f in self._checked or self._check_item(f)):
                item = self._items[f]
                if i not in item[1] and s not in self._definers:  # type: ignore[index]
                    end, name = int(scan.ends[i, f]), i if label is None else label
                    out[f] = self._item(item[0], s, end, name)  # type: ignore[index]
                    continue
            elif how == _INT:
                out[f] = self._int(f, i, s, i if label is None else label)
                continue
            elif how == _ROW:  # rows of one array have no framing: the identity check covers them
                out[f] = self._row(f, s, int(scan.ends[i, f]))
                continue
            spans.append(f)
        if spans:
            self._read_spans(out, i, starts, spans, i if label is None else label)
        if not self._planned and self._loader is not None:
            self._plan()
        if check:
            self._check_same([i if label is None else label])
        return tuple(out)

    def _read_spans(
        self, out: list[Any], i: int, starts: list[int], fields: list[int], name: int
    ) -> None:
        """Read ``fields`` of sample ``i`` by span into ``out``; errors name sample ``name``."""
        if len(fields) == 1 and starts[fields[0]] not in self._definers:
            out[fields[0]] = self._lone_span(i, fields[0], starts[fields[0]], name)
        else:
            self._spans_into(out, i, starts, fields, name)

    def _lone_span(self, i: int, f: int, s: int, name: int) -> Any:
        """Field ``f`` of sample ``i``, the one field of it read by span (what
        :meth:`_spans_into` does for one field, with none of its cross-field bookkeeping)."""
        fd = self._fd if self._pid == os.getpid() else self._fileno()
        if self._loader is not None:
            try:
                value = self._loader.load(fd, i, f, s)
            except PickleshardError:
                raise
            except Exception as exc:  # bad bytes make the unpickler and numpy raise many types
                raise self._bad_span(s, exc, name) from None
            if value is not _SLOW:
                return value
        scan = self.scan
        ext = scan.externals(i, f).tolist()
        base = scan.memo_base.item(i, f)
        return self._span(s, scan.ends.item(i, f), base, ext, {}, -1, name=name)

    def _spans_into(
        self, out: list[Any], i: int, starts: list[int], fields: list[int], name: int
    ) -> None:
        """Read ``fields`` of sample ``i`` by span into ``out``, in file order."""
        scan, nf = self.scan, len(starts)
        ends, bases = scan.ends[i].tolist(), scan.memo_base[i].tolist()
        offs = scan.ext_offsets[i * nf : i * nf + nf + 1].tolist()
        memos: Memos = {}
        if len(fields) > 1:
            fields.sort(key=starts.__getitem__)
        exts = [
            scan.ext_keys[offs[f] : offs[f + 1]].tolist() if offs[f + 1] > offs[f] else []
            for f in fields
        ]
        # A value two fields refer to must come out as one object: no literal copies for them.
        shared = len(exts) > 1 and sum(map(len, exts)) > len(set().union(*exts))
        for f, ext in zip(fields, exts, strict=True):
            s = starts[f]
            literal = not shared or all(sum(k in other for other in exts) == 1 for k in ext)
            capture = self._definers.get(s, -1)
            out[f] = self._span(
                s, ends[f], bases[f], ext, memos, capture, literal=literal, name=name
            )

    def read_samples(
        self, indices: Sequence[int], labels: Sequence[int] | None = None
    ) -> list[tuple[Any, ...]]:
        """Samples at ``indices`` (in that order), equal to :meth:`read_sample` of each.

        Reads go in file-offset order. Fewer than 16 samples, or samples the compiled read takes
        whole (no arrays among their fields), are read one by one; otherwise fields read from
        payloads are read a batch at a time: the arrays of one field land in one
        ``(len(indices), ...)`` array (each sample gets a view of its row), small ints come from
        the decoded column; samples that need it are read by :meth:`read_sample`. A refused
        global names the sample's label (its index in a dataset: ``labels[k]`` for
        ``indices[k]``), else its index in the file.
        """
        n = self._n
        picked: Any = indices  # a sequence of ints; also an array of them, or one int
        wanted: list[int]
        if isinstance(picked, np.ndarray):
            wanted = picked.reshape(-1).tolist()
        elif isinstance(picked, (int, np.integer)):
            wanted = [int(picked)]
        else:
            wanted = list(picked)
        if not wanted:
            return []
        if min(wanted) < -n or max(wanted) >= n:
            bad = next(int(i) for i in wanted if not -n <= i < n)
            raise IndexError(f"sample {bad} out of range for {self.path} ({n} samples)")
        if min(wanted) < 0 or not all(type(i) is int for i in wanted):
            wanted = [int(i) + n if i < 0 else int(i) for i in wanted]
        if len(wanted) < BATCH_READ_MIN or (self._plan_ok and not self._plan_items):
            return self._each(wanted, labels)
        out = self._batch(wanted, labels)
        if self.verify:  # after the reads: a write that raced them has stamped the file by now
            self._check_same(wanted if labels is None else labels)
        return out

    def _batch(self, wanted: list[int], labels: Sequence[int] | None) -> list[tuple[Any, ...]]:
        """:meth:`read_samples` of at least :data:`BATCH_READ_MIN` samples (in range), with
        fields read from payloads a batch at a time; the caller checks the file's identity."""
        idx = np.asarray(wanted, dtype=np.int64)
        hook = self.find_class if isinstance(self.find_class, AllowlistFindClass) else None
        starts = self.scan.starts[idx]
        order = np.argsort(starts.min(axis=1) if starts.shape[1] else idx, kind="stable").tolist()
        whole = np.zeros(len(idx), bool)  # read by read_sample
        cols: list[Any] = [None] * len(self._how)
        spans = []
        for f, how in enumerate(self._how):
            if how == _ITEM and self._check_item(f):
                names = idx if labels is None else np.asarray(labels, np.int64)
                cols[f] = self._items_batch(f, idx, starts[:, f], order, whole, names)
            elif how == _INT and (values := self._int_values(f)) is not None:
                cols[f] = values[idx].tolist()
            elif how == _ROW:
                ends = self.scan.ends[idx, f].tolist()
                got = [None] * len(idx)
                for k in order:
                    got[k] = self._row(f, int(starts[k, f]), ends[k])
                cols[f] = got
            else:
                spans.append(f)
        out: list[tuple[Any, ...]] = [()] * len(idx)
        idx_l, whole_l = idx.tolist(), whole.tolist()
        starts_l = starts.tolist() if spans else None
        for k in order:
            i = idx_l[k]
            if hook is not None:
                hook.sample = labels[k] if labels is not None else i
            if whole_l[k]:
                out[k] = self._sample(i, labels[k] if labels is not None else None, False)
                continue
            row = [c[k] if c is not None else None for c in cols]
            if starts_l is not None:
                self._read_spans(
                    row, i, starts_l[k], list(spans), labels[k] if labels is not None else i
                )
            out[k] = tuple(row)
        return out

    def _each(self, idx: list[int], labels: Sequence[int] | None) -> list[tuple[Any, ...]]:
        """Samples ``idx`` (in range, in that order) read one by one in offset order: by one
        compiled call when this process has a plan, else by :meth:`_sample` each."""
        items = sorted(idx)
        if items == idx:  # already in offset order (a dataset's batch is)
            order: Sequence[int] = range(len(idx))
            names = idx if labels is None else list(labels)
        else:
            order = sorted(range(len(idx)), key=idx.__getitem__)
            items = [idx[k] for k in order]
            names = items if labels is None else [labels[k] for k in order]
        got: list[Any]
        if self._plan_ok and self._pid == os.getpid():
            try:  # the compiled read checks the file's identity after the batch
                got = self._loader.load_samples(self._fd, items, names, self._labelled)
            except PickleshardError:
                raise
            except Exception as exc:  # bad bytes make the unpickler raise many types
                if self._plan_span < 0:  # only the span can meet bad bytes
                    raise
                at = self._loader.at
                start = int(self.scan.starts[items[at], self._plan_span])
                raise self._bad_span(start, exc, names[at]) from None
        else:
            got = [self._labelled(i, name) for i, name in zip(items, names, strict=True)]
            if self.verify:
                self._check_same(names)
        if isinstance(order, range):
            return got
        out: list[tuple[Any, ...]] = [()] * len(idx)
        for k, value in zip(order, got, strict=True):
            out[k] = value
        return out

    def _labelled(self, i: int, label: int) -> tuple[Any, ...]:
        """:meth:`_sample`, a refusal by any allowlist of this reader naming ``label``."""
        if isinstance(self.find_class, AllowlistFindClass):
            self.find_class.sample = label
        return self._sample(i, label, False)

    def _items_batch(
        self,
        f: int,
        idx: np.ndarray,
        starts: np.ndarray,
        order: list[int],
        whole: np.ndarray,
        labels: np.ndarray,
    ) -> list[np.ndarray]:
        """Field ``f`` (an :class:`ArrayItem`) of samples ``idx``: views of the rows of one new
        array; samples it cannot read from their payloads are marked in ``whole``; an error
        names ``labels[k]`` for ``idx[k]``."""
        spec, exceptions = self._items[f]  # type: ignore[misc]
        rows = np.empty((len(idx), *spec.shape), spec.dtype)
        fd = self._fileno()
        definers = self._definers
        starts_l, idx_l = starts.tolist(), idx.tolist()
        ends_l, labels_l = self.scan.ends[idx, f].tolist(), labels.tolist()
        todo = []
        for k in order:
            if idx_l[k] in exceptions or starts_l[k] in definers:
                whole[k] = True
            else:
                todo.append(k)
        done = 0
        if self._loader is not None and self.verify and len(rows):  # one compiled call
            framing = self._framings.get(f)
            if framing is None:
                framing = self._framings[f] = _framing(spec)
            done = self._loader.fill_rows(fd, rows, framing, todo, starts_l, ends_l, labels_l)
        for k in todo[done:]:  # the reference; and the rest after a short read, its error named
            self._fill(fd, rows[k, ...], spec, starts_l[k], ends_l[k], labels_l[k])  # ... 0-d too
        read = len(todo)
        self.stats.array_items += read
        self.stats.bytes_read += read * (rows.nbytes // max(len(idx), 1))
        if spec.swap:
            rows.byteswap(inplace=True)
        if spec.readonly:
            rows.flags.writeable = False  # before the views are taken: each keeps its own flag
        return [rows[k, ...] for k in range(len(idx))]

    def _bad_span(self, start: int, exc: Exception, name: int | None) -> Exception:
        """The error for the span at ``start`` that raised ``exc`` read for sample ``name``."""
        if not isinstance(exc, MemoIdPastSpan):
            return _damaged(self.path, start, exc)
        # a file rewritten since its scan is the likelier cause, but only fstat can say so
        mine = self._fd >= 0 and self._pid == os.getpid()
        what = self.identity.differs(self._fstat()) if self.verify and mine else None
        samples = None if name is None else [name]
        if what is not None:
            return self._changed(what, exc.offset, samples)
        return MemoIdError(
            self.path,
            f"{exc}: the data file does not match its index (a crafted file or index)",
            offset=exc.offset,
            sample=name,
        )


def _framing(spec: ArrayItem) -> Any:
    """The compiled reads' form of ``spec``'s framing (``_cscan.Framing``)."""
    from ._cscan import Framing

    return Framing(
        spec.head, spec.tail, _flat(spec.head_masked), _flat(spec.tail_masked), spec.bounds
    )


def _flat(ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    """``[lo, hi)`` ranges as one flat int64 array ``lo0, hi0, lo1, ...`` (for the loader)."""
    return np.asarray(ranges, np.int64).reshape(-1)


def _damaged(path: str, start: int, exc: Exception) -> PickleshardError:
    misuse = guard_misuse(exc, path, start)
    if misuse is not None:
        return misuse
    if isinstance(exc, MemoryError):  # not a sign of damage: say what happened
        detail = str(exc) or "MemoryError"
        return ReadMemoryError(path, f"out of memory reading this span: {detail}", offset=start)
    if isinstance(exc, EOFError) or "truncated" in str(exc):
        return TruncatedPickleError(
            path, f"span ends early (file changed since the scan?): {exc}", offset=start
        )
    return CorruptPickleError(
        path,
        f"span does not unpickle (file changed since the scan?): {type(exc).__name__}: {exc}",
        offset=start,
    )
