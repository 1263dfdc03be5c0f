"""Read samples straight out of an unmodified pickle file, span by span.

:class:`SpanReader` reads sample ``i`` of a :class:`~pickleshard.scan.ScanResult` with
``os.pread``: an ``array_row`` field is read into a fresh array; a ``pickle`` field is unpickled
from its span alone, in one of two ways that give the same value:

- *fast* (the default): the span is rewritten into a standalone pickle, ``PROTO p`` + a
  prologue that stores each external value (fed as a persistent id) at local memo ids ``0..k-1``
  + the span with FRAME headers dropped, PUT/GET renumbered to ``k + (key - memo_base)`` and
  external GETs pointed at the prologue's ids + ``STOP``, and read by the C unpickler.
  ``bytes``/``bytearray`` payloads of ``big`` bytes or more that were not already read are
  passed out of band (``NEXT_BUFFER``), read by ``pread`` straight into their own buffer.
- *general*: :class:`pickleshard.memo.SpanUnpickler` reads the span as is (pure Python, slow,
  obviously right); the oracle for the fast path.

External values come from the file's :class:`~pickleshard.memo.SharedTable`: the element that
defines one is replayed whole, once per read (all its values then come from that one replay, so
identity between them holds). Immutable values (str, bytes, numbers, dtypes, classes and
functions, tuples of these) are kept in a per-reader cache of at most ``shared_bytes``; mutable
ones are rebuilt for every read, so mutating a sample never changes another. Within one
:meth:`SpanReader.read_sample` call, a field whose values a later field refers to is read first
and its objects are reused, so ``x is y``-style sharing within a sample survives.

Every unpickler is built by :meth:`SpanReader._unpickler_hooks`' ``find_class``: pass
``find_class=`` to restrict which globals a file may load.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import opcodes as oc
from .errors import CorruptPickleError, TruncatedPickleError, UnreadableFileError
from .memo import WINDOW, SpanFile, SpanUnpickler
from .scan import ScanResult

__all__ = ["BIG", "ReaderStats", "SpanReader", "rewrite_span"]

BIG = 64 * 1024
FindClass = Callable[[str, str], Any]
_PROLOGUE: dict[int, bytes] = {}


def _prologue(n_ext: int) -> bytes:
    """Store persistent ids 0..n_ext-1 at memo ids 0..n_ext-1 (``BININT j BINPERSID PUT j POP``)."""
    got = _PROLOGUE.get(n_ext)
    if got is None:
        parts = []
        for j in range(n_ext):
            pid = (
                bytes((oc.BININT1_OP, j))
                if j < 256
                else bytes((oc.BININT_OP,)) + j.to_bytes(4, "little")
            )
            parts.append(pid + bytes((oc.BINPERSID_OP,)) + oc.encode_put(j) + bytes((oc.POP_OP,)))
        got = b"".join(parts)
        if n_ext < 64:
            _PROLOGUE[n_ext] = got
    return got


def rewrite_span(
    read_at: Callable[[int, int], bytes],
    start: int,
    end: int,
    *,
    protocol: int,
    memo_base: int,
    shift: int,
    externals: Sequence[int],
    read_payload: Callable[[int, int, int], Any] | None = None,
    big: int = BIG,
) -> tuple[bytearray, list[Any]]:
    """Rewrite span ``[start, end)`` into a standalone pickle; return ``(pickle, buffers)``.

    ``externals`` are the span's external memo keys: persistent id ``j`` must resolve to the
    value of ``externals[j]``. ``read_payload(offset, length, kind)`` (kind ``P_BYTES`` or
    ``P_BYTEARRAY``) reads an out-of-band payload; without it every payload stays in band.
    """
    n_ext = len(externals)
    local = {int(k): j for j, k in enumerate(externals)}
    out = bytearray(bytes((oc.PROTO_OP, protocol)) + _prologue(n_ext))
    buffers: list[Any] = []
    FORM, ARGLEN, ACTION = oc.FORM, oc.ARGLEN, oc.ACTION
    here = start  # file offset of buf[0]
    buf = read_at(here, min(end - here, max(WINDOW, big)))
    i = mark = 0
    while True:
        blen = len(buf)
        if i >= blen:
            out += buf[mark:i]
            here += i
            if here >= end:
                break
            buf, i, mark = read_at(here, min(end - here, WINDOW)), 0, 0
            if not buf:
                raise EOFError(f"file ends at byte {here}, inside a span ending at {end}")
            continue
        op = buf[i]
        form = FORM[op]
        need = 1 + ARGLEN[op]
        if form == oc.F_FIXED:
            nxt = i + need
        elif form == oc.F_LINE or form == oc.F_LINE2:
            nl = buf.find(b"\n", i + 1)
            if nl >= 0 and form == oc.F_LINE2:
                nl = buf.find(b"\n", nl + 1)
            if nl < 0 and here + blen >= end:
                raise EOFError(
                    f"text argument at byte {here + i} has no newline before the span end"
                )
            nxt = nl + 1 if nl >= 0 else blen + WINDOW
        elif i + need > blen:
            nxt = i + need
        else:
            n = (
                buf[i + 1]
                if form == oc.F_LEN1
                else (oc.I4 if form == oc.F_LEN4S else oc.U4 if form == oc.F_LEN4U else oc.U8)(
                    buf, i + 1
                )[0]
            )
            nxt = i + need + n
            if (
                nxt > blen
                and read_payload is not None
                and n >= big
                and oc.PAYLOAD[op] in (oc.P_BYTES, oc.P_BYTEARRAY)
            ):
                out += buf[mark:i]
                out.append(oc.NEXT_BUFFER_OP)
                buffers.append(read_payload(here + i + need, n, oc.PAYLOAD[op]))
                here += nxt
                buf, i, mark = read_at(here, min(end - here, WINDOW)), 0, 0
                continue
        if nxt > blen:  # the opcode runs past the window: read again from its start
            if here + nxt > end and form not in (oc.F_LINE, oc.F_LINE2):
                raise EOFError(f"opcode at byte {here + i} runs past the span end {end}")
            out += buf[mark:i]
            here += i
            buf, i, mark = read_at(here, min(end - here, max(WINDOW, nxt - i, 2 * blen))), 0, 0
            continue
        act = ACTION[op]
        if act == oc.A_GET or act == oc.A_PUT or act == oc.A_FRAME:
            out += buf[mark:i]
            mark = nxt
            if act != oc.A_FRAME:
                ident = (
                    int(buf[i + 1])
                    if ARGLEN[op] == 1
                    else int(oc.U4(buf, i + 1)[0])
                    if ARGLEN[op] == 4
                    else int(buf[i + 1 : nxt - 1])
                )
                key = ident + shift
                if act == oc.A_PUT:
                    out += oc.encode_put(n_ext + key - memo_base)
                else:
                    out += oc.encode_get(local[key] if key < memo_base else n_ext + key - memo_base)
        i = nxt
    out.append(oc.STOP_OP)
    return out, buffers


@dataclass
class ReaderStats:
    """Counters of a :class:`SpanReader` (per process)."""

    fast_reads: int = 0
    general_reads: int = 0
    array_rows: int = 0
    replays: int = 0
    shared_hits: int = 0
    shared_misses: int = 0
    shared_bytes: int = 0
    bytes_read: int = 0


_LEAVES = (str, bytes, int, float, complex, bool, type(None), range)
_CALLABLES = (type, types.FunctionType, types.BuiltinFunctionType, np.dtype, np.generic)


def _immutable(v: Any, depth: int = 0) -> bool:
    if type(v) in _LEAVES or isinstance(v, _CALLABLES):
        return True
    if type(v) in (tuple, frozenset):
        return depth < 8 and all(_immutable(x, depth + 1) for x in v)
    return False


class _FastUnpickler(pickle.Unpickler):
    def __init__(
        self, file: Any, ext: list[Any], find_class: FindClass | None, **kwargs: Any
    ) -> None:
        super().__init__(file, **kwargs)
        self._ext = ext
        self._find_class_hook = find_class

    def persistent_load(self, pid: Any) -> Any:
        return self._ext[pid]

    def find_class(self, module: str, name: str) -> Any:
        if self._find_class_hook is not None:
            return self._find_class_hook(module, name)
        return super().find_class(module, name)


class _Read:
    """One read_sample call: memo values of the elements replayed (or fields read) during it."""

    def __init__(self) -> None:
        self.memos: dict[int, dict[int, Any]] = {}


class SpanReader:
    """Reads samples of one scanned file by span; one per file and process.

    ``encoding`` / ``errors`` are those of :func:`pickle.load` (``"latin1"`` or ``"bytes"`` for
    Python 2 pickles). ``find_class(module, name)``, if given, replaces the unpickler's global
    lookup everywhere. ``general=True`` reads every pickle span with the pure-Python general path.
    Immutable shared values are cached up to ``shared_bytes`` (``sys.getsizeof`` estimate). The
    file descriptor is opened on first use and reopened after a fork.
    """

    def __init__(
        self,
        scan: ScanResult,
        *,
        encoding: str = "ASCII",
        errors: str = "strict",
        find_class: FindClass | None = None,
        general: bool = False,
        shared_bytes: int = 64 << 20,
        big: int = BIG,
    ) -> None:
        self.scan = scan
        self.path = scan.path
        self.encoding, self.errors, self.find_class = encoding, errors, find_class
        self.general = general
        self.shared_budget = shared_bytes
        self.big = big
        self.stats = ReaderStats()
        self._shared: dict[int, Any] = {}
        self._definer_starts = {s: j for j, (s, _, _, _) in enumerate(scan.shared.elements)}
        self._rec_starts = np.ascontiguousarray(scan.records[:, 0])
        self._fd = -1
        self._pid = -1

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_fd=-1, _pid=-1, _shared={}, stats=ReaderStats())
        return state

    def _fileno(self) -> int:
        if self._pid != os.getpid():
            self._shared, self._fd = {}, -1
            try:
                self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise UnreadableFileError(
                    self.path, f"cannot open: {exc.strerror or exc}"
                ) from None
            self._pid = os.getpid()
        return self._fd

    def _read_at(self, offset: int, n: int) -> bytes:
        data = os.pread(self._fileno(), n, offset)
        self.stats.bytes_read += len(data)
        return data

    def _readinto_at(self, offset: int, view: memoryview) -> int:
        got = 0
        while got < len(view):
            k = os.preadv(self._fileno(), [view[got:]], offset + got)
            if k <= 0:
                break
            got += k
        self.stats.bytes_read += got
        return got

    def _payload(self, offset: int, n: int, kind: int) -> Any:
        if kind == oc.P_BYTES:
            data = self._read_at(offset, n)
            ok = len(data) == n
        else:
            data = bytearray(n)
            ok = self._readinto_at(offset, memoryview(data)) == n
        if not ok:
            raise EOFError(f"file ends inside a {n}-byte payload at byte {offset}")
        return data

    # -- one span -------------------------------------------------------------------------------

    def _shift(self, start: int) -> int:
        return int(self.scan.records[int(np.searchsorted(self._rec_starts, start, "right")) - 1, 2])

    def _span(
        self, start: int, end: int, base: int, ext: Sequence[int], read: _Read, capture: int
    ) -> Any:
        """Unpickle one span; if ``capture >= 0`` keep its memo as that of shared element ``capture``."""
        shift = self._shift(start)
        try:
            if self.general:
                self.stats.general_reads += 1
                span = SpanFile(
                    self._read_at, start, end, self.scan.protocol, readinto_at=self._readinto_at
                )
                u = SpanUnpickler(
                    span,
                    first_id=base - shift,
                    resolve=lambda i: self._external(i + shift, read),
                    encoding=self.encoding,
                    errors=self.errors,
                    find_class=self.find_class,
                )
                value = u.load()
                memo = {i + shift: v for i, v in u.memo.items()} if capture >= 0 else None
            else:
                self.stats.fast_reads += 1
                objs = [self._external(int(k), read) for k in ext]
                data, buffers = rewrite_span(
                    self._read_at,
                    start,
                    end,
                    protocol=self.scan.protocol,
                    memo_base=base,
                    shift=shift,
                    externals=ext,
                    read_payload=self._payload,
                    big=self.big,
                )
                f = _FastUnpickler(
                    io.BytesIO(data),
                    objs,
                    self.find_class,
                    encoding=self.encoding,
                    errors=self.errors,
                    buffers=buffers,
                )
                value = f.load()
                n_ext = len(objs)
                memo = (
                    {base + i - n_ext: v for i, v in f.memo.copy().items() if i >= n_ext}
                    if capture >= 0
                    else None
                )
        except (EOFError, pickle.UnpicklingError) as exc:
            raise _damaged(self.path, start, exc) from None
        if memo is not None:
            read.memos[capture] = memo
        return value

    def _external(self, key: int, read: _Read) -> Any:
        if key in self._shared:
            self.stats.shared_hits += 1
            return self._shared[key]
        self.stats.shared_misses += 1
        e = self.scan.shared.element(key)
        memo = read.memos.get(e)
        if memo is None:
            self.stats.replays += 1
            start, end, base, ext = self.scan.shared.elements[e]
            self._span(start, end, base, ext, read, e)
            memo = read.memos[e]
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
        view = memoryview(out.reshape(-1).view(np.uint8))
        if self._readinto_at(start, view) != end - start:
            raise TruncatedPickleError(self.path, "file ends inside an array row", offset=start)
        if spec.swap:
            out.byteswap(inplace=True)
        self.stats.array_rows += 1
        return out if out.ndim else out[()]

    def read_sample(self, i: int) -> tuple[Any, ...]:
        """Sample ``i`` as a tuple with one value per field, equal to the whole-file reading."""
        scan = self.scan
        n = scan.num_samples
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {self.path} ({n} samples)")
        i %= n
        starts, ends, bases = scan.starts[i], scan.ends[i], scan.memo_base[i]
        read = _Read()
        out: list[Any] = [None] * len(scan.fields)
        for f in np.argsort(starts, kind="stable") if len(out) > 1 else range(len(out)):
            f = int(f)
            s, e = int(starts[f]), int(ends[f])
            if scan.kinds[f] == "array_row":
                out[f] = self._row(f, s, e)
            else:
                out[f] = self._span(
                    s, e, int(bases[f]), scan.externals(i, f), read, self._definer_starts.get(s, -1)
                )
        return tuple(out)

    def read_samples(self, indices: Sequence[int]) -> list[tuple[Any, ...]]:
        """Samples at ``indices`` (in that order), read in file-offset order."""
        idx = np.asarray(indices, dtype=np.int64)
        out: list[tuple[Any, ...]] = [()] * len(idx)
        if len(idx):
            n = self.scan.num_samples
            order = np.argsort(
                self.scan.starts[idx % max(n, 1), 0] if self.scan.starts.shape[1] else idx,
                kind="stable",
            )
            for k in order:
                out[int(k)] = self.read_sample(int(idx[k]))
        return out


def _damaged(path: str, start: int, exc: Exception) -> CorruptPickleError:
    if isinstance(exc, EOFError) or "truncated" in str(exc):
        return TruncatedPickleError(
            path, f"span ends early (file changed since the scan?): {exc}", offset=start
        )
    return CorruptPickleError(
        path, f"span does not unpickle (file changed since the scan?): {exc}", offset=start
    )
