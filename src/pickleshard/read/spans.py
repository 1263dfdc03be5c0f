"""Fields read by span: the sample's bytes unpickled alone, its external memo values resolved.

A span is unpickled in one of two ways that give the same value:

- *fast* (the default): the span is rewritten into a standalone pickle
  (:func:`pickleshard.picklekit.rewrite.rewrite_span`, or its compiled twin): ``PROTO p`` + a prologue
  that stores each external value at local memo ids ``0..k-1`` (by value when every one has a
  literal, see :func:`~pickleshard.picklekit.rewrite.literal_head`, else fed as persistent ids) + the
  span with FRAME headers dropped and memo ids renumbered + ``STOP``, read by the C unpickler,
  with the global lookup hooked only if the span names a global. ``bytes``/``bytearray``
  payloads of ``big`` bytes or more are passed out of band, read straight into their buffer.
- *general*: :class:`pickleshard.picklekit.unpicklers.SpanUnpickler` reads the span as is (pure Python, slow,
  obviously right); the oracle for the fast path.

External values come from :class:`~pickleshard.picklekit.externals.ExternalMemos` (one per
sample read: the element that defines one is replayed whole, once, so identity between its
values holds). Immutable values (str, bytes, numbers, dtypes, classes and functions, tuples of
these) are kept across reads in a :class:`~pickleshard.io.lru.BudgetCache` of ``shared_bytes``
(each value counted at ``sys.getsizeof``, least recently used out first; a value larger than the
budget is not kept); mutable ones are rebuilt for every read, so mutating a sample never changes
another.
"""

from __future__ import annotations

import copyreg
import functools
import io
import pickle
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ..errors import PickleshardError
from ..io import ByteSource
from ..io.lru import BudgetCache
from ..picklekit import opcodes as oc
from ..picklekit.compiled import CORE
from ..picklekit.externals import ExternalMemos, MemoShifts
from ..picklekit.rewrite import (
    FindClass,
    HookedUnpickler,
    _compiled_rewrite,
    literal_head,
    rewrite_span,
)
from ..picklekit.spanfile import SpanFile
from ..picklekit.unpicklers import SpanUnpickler
from ..safety.policy import GUARD_TYPES
from ..scan import ScanResult
from .plan import ReaderStats

__all__ = ["SLOW", "SpanFields"]

_MAX_HEADS = 4096  # literal prologues kept per reader, one per distinct tuple of externals
_MISSING = object()
_LEAVES = (str, bytes, int, float, complex, bool, type(None), range)
_CALLABLES: tuple[type, ...] = (type, types.FunctionType, types.BuiltinFunctionType)
_CALLABLES += (np.dtype, np.generic, *GUARD_TYPES)  # the allowlist's guards: immutable

# the compiled lone-span read declined: read it here (no extension: no compiled reads either)
SLOW: object = CORE.SLOW if CORE is not None else object()

BadSpan = Callable[[int, Exception, "int | None"], Exception]


def _immutable(v: Any, depth: int = 0) -> bool:
    if type(v) in _LEAVES or isinstance(v, _CALLABLES):
        return True
    if type(v) in (tuple, frozenset):
        return depth < 8 and all(_immutable(x, depth + 1) for x in v)
    return False


def _no_replay(e: int) -> dict[int, Any]:
    raise AssertionError("replaced before use")


class SpanFields:
    """The span reads of one file (every field its plan reads by span), and their caches.

    ``find_class(module, name)`` replaces the global lookup of every unpickler built here (None:
    the plain lookup); ``bad_span(start, exc, label)`` turns an exception of a span's
    unpickling into the error to raise. :meth:`reset` empties the caches (a new process).
    """

    def __init__(
        self,
        scan: ScanResult,
        source: ByteSource,
        stats: ReaderStats,
        *,
        encoding: str,
        errors: str,
        find_class: FindClass | None,
        general: bool,
        engine: str,
        big: int,
        shared_bytes: int,
        bad_span: BadSpan,
    ) -> None:
        self.scan, self.source, self.stats = scan, source, stats
        self.encoding, self.errors, self.find_class = encoding, errors, find_class
        self.plain = (encoding, errors) == ("ASCII", "strict")  # pickle.loads' own defaults
        self.general, self.big = general, big
        self.rewrite = _compiled_rewrite() if engine == "compiled" else rewrite_span
        self.bad_span = bad_span
        self.shifts = MemoShifts.of_records(scan.records)
        self.definers = {s: j for j, (s, _, _, _) in enumerate(scan.shared.elements)}
        self.shared: BudgetCache[int, Any] = BudgetCache(shared_bytes)  # .stats: its counters
        self.heads: dict[tuple[int, ...], bytes | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(heads={})  # the cache of shared values travels empty
        return state

    def reset(self) -> None:
        """Forget the cached values and prologues (new ones: a compiled loader built before
        keeps the old prologues)."""
        self.shared, self.heads = BudgetCache(self.shared.budget), {}

    # -- entry points ---------------------------------------------------------------------

    def one(self, i: int, f: int, start: int, label: int, loader: Any) -> Any:
        """Field ``f`` of sample ``i`` (its span at ``start``), the one field of the sample read
        by span; by the compiled ``loader`` when it takes it (else None or it declined)."""
        if loader is not None:
            try:
                value = loader.load(self.source.fileno(), i, f, start)
            except PickleshardError:
                raise
            except Exception as exc:  # bad bytes make the unpickler and numpy raise many types
                raise self.bad_span(start, exc, label) from None
            if value is not SLOW:
                return value
        scan = self.scan
        ext = scan.externals(i, f).tolist()
        base = scan.memo_base.item(i, f)
        return self._span(start, scan.ends.item(i, f), base, ext, self._memos(), name=label)[0]

    def many(
        self, out: list[Any], i: int, starts: list[int], fields: list[int], label: int, loader: Any
    ) -> None:
        """Read ``fields`` of sample ``i`` by span into ``out``, in file order: a field whose
        values a later field refers to is read first and its objects reused by it, so ``x is
        y``-style sharing within a sample survives; errors name ``label``."""
        if len(fields) == 1 and starts[fields[0]] not in self.definers:
            out[fields[0]] = self.one(i, fields[0], starts[fields[0]], label, loader)
            return
        scan, nf = self.scan, len(starts)
        ends, bases = scan.ends[i].tolist(), scan.memo_base[i].tolist()
        offs = scan.ext_offsets[i * nf : i * nf + nf + 1].tolist()
        memos = self._memos()
        fields = sorted(fields, key=starts.__getitem__)
        exts = [
            scan.ext_keys[offs[f] : offs[f + 1]].tolist() if offs[f + 1] > offs[f] else []
            for f in fields
        ]
        # A value two fields refer to must come out as one object: no literal copies for them.
        shared = len(exts) > 1 and sum(map(len, exts)) > len(set().union(*exts))
        for f, ext in zip(fields, exts, strict=True):
            s = starts[f]
            literal = not shared or all(sum(k in other for other in exts) == 1 for k in ext)
            capture = self.definers.get(s, -1)
            value, memo = self._span(
                s, ends[f], bases[f], ext, memos, capture=capture >= 0, literal=literal, name=label
            )
            if memo is not None:
                memos.memos[capture] = memo
            out[f] = value

    def check_read(self, i: int, f: int, label: int) -> Any:
        """Field ``f`` of sample ``i`` unpickled from its span by the Python path (what an
        array item is checked against)."""
        scan = self.scan
        start, end = int(scan.starts[i, f]), int(scan.ends[i, f])
        ext = scan.externals(i, f).tolist()
        return self._span(start, end, int(scan.memo_base[i, f]), ext, self._memos(), name=label)[0]

    # -- one span ---------------------------------------------------------------------------

    def _memos(self) -> ExternalMemos:
        """The external values of one sample read (its replays kept for that read alone)."""
        memos = ExternalMemos(self._element_of, _no_replay)
        # the replay refers to memos weakly: a closure over memos itself made a reference cycle
        # at every read (garbage only a collection frees, and with it this reader)
        ref = cast(ExternalMemos, weakref.proxy(memos))
        memos.replay = lambda e: self._replay(e, ref)
        return memos

    def _element_of(self, key: int) -> int:
        try:
            return self.scan.shared.element(key)
        except KeyError:
            return -1

    def _replay(self, e: int, memos: ExternalMemos) -> dict[int, Any]:
        self.stats.replays += 1
        start, end, base, ext = self.scan.shared.elements[e]
        memo = self._span(start, end, base, list(ext), memos, capture=True)[1]
        assert memo is not None
        return memo

    def _span(
        self,
        start: int,
        end: int,
        base: int,
        ext: list[int],
        memos: ExternalMemos,
        *,
        capture: bool = False,
        literal: bool = True,
        name: int | None = None,
    ) -> tuple[Any, dict[int, Any] | None]:
        """Unpickle one span: its value, and with ``capture`` its memo as ``{global id:
        value}`` (else None); errors name sample ``name``."""
        shift = self.shifts.single if self.shifts.single is not None else self.shifts.at(start)
        try:
            if self.general:
                self.stats.general_reads += 1
                u = self._general_unpickler(
                    start, end, base - shift, lambda k: self._external(k + shift, memos)
                )
                value = u.load()
                if not capture:
                    return value, None
                return value, {k + shift: v for k, v in u.memo.items()}
            self.stats.fast_reads += 1
            head = self._literal_head(ext, memos) if not capture and literal else None
            objs = [] if head is not None else [self._external(k, memos) for k in ext]
            data, buffers, finds = self.rewrite(
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
            if not capture:
                return self._fast_load(data, objs, buffers, finds), None
            f = self._fast_unpickler(data, objs, buffers)
            value = f.load()
            n_ext = len(objs)
            return value, {base + k - n_ext: v for k, v in f.memo.copy().items() if k >= n_ext}
        except PickleshardError:
            raise
        except Exception as exc:  # bad bytes make the unpickler and numpy raise many types
            raise self.bad_span(start, exc, name) from None

    def _literal_head(self, ext: list[int], memos: ExternalMemos) -> bytes | None:
        """The literal prologue of these externals (see :func:`literal_head`), or None; cached
        per tuple of externals (their values never change: the file is the one scanned)."""
        key = tuple(ext)
        head = self.heads.get(key, _MISSING)
        if head is _MISSING:
            objs = [self._external(k, memos) for k in ext]
            head = literal_head(self.scan.protocol, objs, self.find_class)
            if len(self.heads) < _MAX_HEADS:
                self.heads[key] = head
        return head  # type: ignore[return-value]

    def _external(self, key: int, memos: ExternalMemos) -> Any:
        value = self.shared.get(key, _MISSING)
        if value is not _MISSING:
            return value
        value = memos(key)
        if _immutable(value):
            size = sys.getsizeof(value)
            if size <= self.shared.budget:  # held alone, one value would push out all others
                self.shared.put(key, value, size)
        return value

    # -- bytes ------------------------------------------------------------------------------

    def _read_at(self, offset: int, n: int) -> bytes:
        data = self.source.read_at(offset, n)
        self.stats.bytes_read += len(data)
        return data

    def _readinto_at(self, offset: int, view: memoryview) -> int:
        got = self.source.readinto_at(offset, view)
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

    # -- unpicklers: built here and nowhere else ----------------------------------------------

    def loads(self) -> Callable[[bytearray], Any]:
        """What the compiled loader loads a rewritten span with when it names no global."""
        if self.plain:
            return pickle.loads
        return functools.partial(pickle.loads, encoding=self.encoding, errors=self.errors)

    def hooked_load(self, data: bytearray) -> Any:
        """Load a rewritten span that names a global, through :attr:`find_class`."""
        return self._fast_unpickler(data, [], []).load()

    def _fast_load(self, data: bytearray, objs: list[Any], buffers: list[Any], finds: int) -> Any:
        """Load a rewritten span: the global lookup is hooked only if the span names a global
        (``finds``); persistent ids only if the prologue uses them (``objs``)."""
        if objs or (finds and self.find_class is not None):
            return self._fast_unpickler(data, objs, buffers, hooked=finds > 0).load()
        if self.plain and not buffers:
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
