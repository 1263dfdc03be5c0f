"""Unpickling one span of a pickle with the memo entries it needs: the always-correct general path.

A *span* is a byte range ``[start, end)`` of a pickle file holding the opcodes of one element
(one sample's field, a dict key...). Read alone it is not a pickle: it has no ``PROTO`` or
``STOP``, its ``MEMOIZE`` opcodes must number from the memo id the whole-file unpickler would have
reached at ``start`` (its *first id*), and its ``GET`` opcodes may name ids defined before
``start`` (*external* ids). :class:`SpanUnpickler` reads ``PROTO p`` + span + ``STOP`` through a
:class:`SpanFile`, counts ``MEMOIZE`` from the first id, ignores ``FRAME`` headers (a span may
start or end inside a frame), and asks a ``resolve`` callable for every external id. It is
``pickle._Unpickler`` (pure Python) underneath, so it is slow and obviously right: the oracle for
the fast path in :mod:`pickleshard.spanread`.

:class:`InspectUnpickler` is the same machinery for the scanner: it never runs code (numpy's
array and dtype reconstruction are evaluated by stand-ins, any other global becomes an inert
:class:`Opaque`) and never reads bulk payloads (they become :class:`Payload` placeholders giving
their file offset), so it can tell, cheaply and safely, whether a span holds a numpy array and
where that array's bytes are. :class:`ElementTable` and :class:`SharedTable` record which memo
entries each element needs from another.
"""

from __future__ import annotations

import copyreg
import pickle
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .picklekit.opcodes import FRAME_OP, I4, MEMOIZE_OP, OPNAME, U4, U8

__all__ = ["ArraySpec", "ElementTable", "InspectUnpickler", "Opaque", "Payload", "SharedTable"]
__all__ += ["MemoIdPastSpan", "SpanFile", "SpanUnpickler"]

WINDOW = 64 * 1024
ReadAt = Callable[[int, int], bytes]
ReadIntoAt = Callable[[int, memoryview], int]
Resolve = Callable[[int], Any]
FindClass = Callable[[str, str], Any]


class MemoIdPastSpan(pickle.UnpicklingError):
    """A span's ``PUT``/``GET`` names a memo id its own bytes cannot have defined: the span's ids
    run on densely from its memo base, one per defining opcode (``MEMOIZE``, ``PUT``: at least one
    byte each), so a span of ``L`` bytes defines at most ``L`` of them. Refused before the C
    unpickler sees it, which would grow its memo to the id (up to 2**32 entries, 32 GB).
    ``offset`` is the opcode's file offset; :mod:`pickleshard.spanread` turns this into
    :class:`~pickleshard.errors.MemoIdError` naming the file and sample."""

    def __init__(self, op: int, offset: int, ident: int, start: int, end: int) -> None:
        self.offset = offset
        super().__init__(
            f"{OPNAME[op]} at byte {offset} names memo id {ident}, past the ids the span "
            f"[{start}, {end}) can define ({end - start} at most from its memo base)"
        )


class SpanFile:
    """``PROTO protocol`` + bytes ``[start, end)`` of a file + ``STOP``, as a read-only file.

    Bytes come from ``read_at(offset, n)`` (``os.pread``, an mmap slice...) in windows of
    ``window`` bytes; a read of ``window`` bytes or more goes straight to ``readinto_at`` /
    ``read_at`` without passing through a window, so a large payload is copied once. ``offset``
    is the file offset of the next span byte; :meth:`skip` moves past bytes without reading them.
    ``bytes_read`` counts the bytes fetched from the file.
    """

    def __init__(
        self,
        read_at: ReadAt,
        start: int,
        end: int,
        protocol: int,
        *,
        readinto_at: ReadIntoAt | None = None,
        window: int = WINDOW,
    ) -> None:
        self.start, self.end = start, end  # the span (``_end`` moves on a short read)
        self._read_at = read_at
        self._readinto_at = readinto_at
        self._window = window
        self._end = end
        self._next = start  # file offset of the first byte not yet fetched
        self._buf = bytes((0x80, protocol))
        self._i = 0
        self._tail = b"."
        self._tail_in_buf = False
        self.bytes_read = 0

    @property
    def offset(self) -> int:
        """File offset of the next byte of the span (meaningless once ``STOP`` was returned)."""
        return self._next - (len(self._buf) - self._i) + self._tail_in_buf

    def _fetch(self, n: int) -> bytes:
        n = min(n, self._end - self._next)
        if n <= 0:
            return b""
        data = self._read_at(self._next, n)
        self._next += len(data)
        self.bytes_read += len(data)
        if len(data) < n:  # the file is shorter than the span: never add STOP, let it fail
            self._end, self._tail = -1, b""
        return data

    def _fill(self, need: int) -> None:
        data = self._buf[self._i :] + self._fetch(
            max(self._window, need - (len(self._buf) - self._i))
        )
        if self._next >= self._end and self._tail:
            data, self._tail, self._tail_in_buf = data + self._tail, b"", True
        self._buf, self._i = data, 0

    def read(self, n: int) -> bytes:
        avail = len(self._buf) - self._i
        if n > avail:
            if n - avail >= self._window and self._next + n - avail <= self._end:
                head = self._buf[self._i :]
                self._buf, self._i = b"", 0
                return head + self._fetch(n - avail)
            self._fill(n)
        out = self._buf[self._i : self._i + n]
        self._i += len(out)
        return out

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n, avail = len(view), len(self._buf) - self._i
        direct = n - avail >= self._window and self._next + n - avail <= self._end
        if direct and self._readinto_at is not None:
            view[:avail] = self._buf[self._i :]
            self._buf, self._i = b"", 0
            got = self._readinto_at(self._next, view[avail:])
            self._next += got
            self.bytes_read += got
            return avail + got
        data = self.read(n)
        view[: len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        while True:
            nl = self._buf.find(b"\n", self._i)
            if nl >= 0:
                return self.read(nl + 1 - self._i)
            avail = len(self._buf) - self._i
            self._fill(avail + self._window)
            if len(self._buf) - self._i == avail:
                return self.read(avail)

    def skip(self, n: int) -> None:
        avail = len(self._buf) - self._i
        if n <= avail:
            self._i += n
            return
        self._next += n - avail
        self._buf, self._i = b"", 0


class ExternalMemo(dict[int, Any]):
    """A memo dict whose missing ids are asked of ``resolve`` (and then kept)."""

    def __init__(self, resolve: Resolve) -> None:
        super().__init__()
        self._resolve = resolve

    def __missing__(self, memo_id: int) -> Any:
        value = self._resolve(memo_id)
        self[memo_id] = value
        return value


class SpanUnpickler(pickle._Unpickler):
    """``pickle._Unpickler`` for one span read through a :class:`SpanFile`.

    ``MEMOIZE`` stores at ``first_id``, ``first_id + 1``...; ``PUT`` stores at its explicit id,
    and a later ``MEMOIZE`` goes on from the id after it;
    a ``GET`` of an id not stored yet calls ``resolve(id)`` (ids are the file's own, record-local
    ids). ``FRAME`` headers are skipped. After :meth:`load`, ``memo`` holds every id the span
    defined plus the externals it used. ``find_class``, if given, replaces the module lookup.
    """

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)
    # set by pickle._Unpickler, which typeshed does not describe
    stack: list[Any]
    read: Callable[[int], bytes]
    readline: Callable[[], bytes]
    append: Callable[[Any], None]
    _decode_string: Callable[[bytes], Any]

    def __init__(
        self,
        file: SpanFile,
        *,
        first_id: int,
        resolve: Resolve,
        encoding: str = "ASCII",
        errors: str = "strict",
        find_class: FindClass | None = None,
    ) -> None:
        super().__init__(file, encoding=encoding, errors=errors)
        self.span = file
        self.memo: ExternalMemo = ExternalMemo(resolve)
        self._next_id = first_id
        self._id_limit = first_id + file.end - file.start  # see MemoIdPastSpan
        self._find_class_hook = find_class

    def find_class(self, module: str, name: str) -> Any:
        if self._find_class_hook is not None:
            return self._find_class_hook(module, name)
        return super().find_class(module, name)

    def load_memoize(self) -> None:
        self.memo[self._next_id] = self.stack[-1]
        self._next_id += 1

    def _put(self, memo_id: int, op: int, offset: int) -> None:
        """``PUT`` (opcode ``op`` at file ``offset``) of ``memo_id``."""
        if memo_id < 0:
            raise ValueError("negative PUT argument")
        if memo_id >= self._id_limit:  # as the fast path refuses it (no reader's paths differ)
            raise MemoIdPastSpan(op, offset, memo_id, self.span.start, self.span.end)
        self.memo[memo_id] = self.stack[-1]
        # The scanner admits only ids stored in order, so a MEMOIZE after this PUT (as C's
        # unpickler counts, len(memo)) stores at the next id.
        self._next_id = memo_id + 1

    def load_put(self) -> None:
        at = self.span.offset - 1  # the opcode's, read already
        self._put(int(self.readline()[:-1]), pickle.PUT[0], at)

    def load_binput(self) -> None:
        at = self.span.offset - 1
        self._put(self.read(1)[0], pickle.BINPUT[0], at)

    def load_long_binput(self) -> None:
        at = self.span.offset - 1
        self._put(U4(self.read(4))[0], pickle.LONG_BINPUT[0], at)

    def load_frame(self) -> None:
        self.read(8)

    dispatch[MEMOIZE_OP] = load_memoize
    dispatch[pickle.PUT[0]] = load_put
    dispatch[pickle.BINPUT[0]] = load_binput
    dispatch[pickle.LONG_BINPUT[0]] = load_long_binput
    dispatch[FRAME_OP] = load_frame


class NotInspectable(Exception):
    """The span cannot be evaluated (a memo reference that cannot be resolved, bad bytes)."""


class Opaque:
    """What the inspector builds from any global outside its allowlist: an inert stand-in.

    Nothing is imported or run; calling it, instantiating it, giving it state or items all yield
    stand-ins, so a span that merely *contains* unknown objects can still be replayed for the
    dtypes and strings it defines. A value that *is* a stand-in has an unknown type.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        return object.__new__(Opaque)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Opaque:
        return Opaque()

    def _ignore(self, *args: Any) -> None:
        return None

    __setstate__ = __setitem__ = append = extend = add = _ignore


class Payload(bytes):
    """Stand-in for a payload the inspector skipped: ``length`` bytes at file ``offset``.

    It *is* the payload's bytes when shorter than 4 KiB (dtype metadata, small arrays), and
    empty otherwise; ``kind`` is "bytes", "bytearray" or "text".
    """

    offset: int
    length: int
    kind: str

    @classmethod
    def make(cls, data: bytes, offset: int, length: int, kind: str) -> Payload:
        p = cls(data)
        p.offset, p.length, p.kind = offset, length, kind
        return p


class _Latin1Text:
    """What ``_codecs.encode(text, 'latin1')`` stands for: protocol <= 2 array bytes as text."""


@dataclass
class ArraySpec:
    """What an inspected span builds when it is a numpy array; ``problem`` is why its rows
    cannot be read in place (None when they can)."""

    payload: Payload | None = None
    dtype: np.dtype[Any] | None = None
    shape: tuple[int, ...] = ()
    problem: str | None = None
    swap: bool = False  # numpy's __setstate__ byte-swaps a non-native array to native order
    frombuffer: bool = False  # built by numpy's _frombuffer (protocol 5), a view of its payload

    def __setstate__(self, state: Any) -> None:  # BUILD after numpy's _reconstruct
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            self.problem = "unrecognised ndarray state"
            return
        shape, dtype, fortran, data = state[-4:]
        self._describe(data, dtype, shape, "F" if fortran else "C")
        self.swap = (
            self.dtype is not None and self.dtype.byteorder in "<>" and not self.dtype.isnative
        )

    def _describe(self, data: Any, dtype: Any, shape: Any, order: str) -> None:
        self.dtype = dtype if isinstance(dtype, np.dtype) else None
        self.shape = tuple(shape) if isinstance(shape, tuple) else ()
        if isinstance(data, _Latin1Text):
            self.problem = "its bytes are pickled as latin-1 text (protocol <= 2)"
        elif not isinstance(data, Payload) or data.kind == "text" or self.dtype is None:
            self.problem = "it is not a plain array of fixed-size items (object dtype?)"
        elif self.dtype.hasobject:
            self.problem = "its dtype holds Python objects"
        elif order != "C" and len(self.shape) > 1:
            self.problem = f"it is stored in {order!r} order, so a row is not contiguous"
        elif data.length != self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64)):
            self.problem = "its payload size does not match its shape"
        self.payload = data if isinstance(data, Payload) else None


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: str, axis_order: Any = None) -> ArraySpec:
    spec = ArraySpec()
    if (
        order == "K"
        and axis_order is not None
        and tuple(axis_order) != tuple(range(len(axis_order)))
    ):
        order = "permuted axes"
    spec._describe(buf, dtype, shape, "C" if order == "K" else order)
    spec.frombuffer = True
    return spec


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> Any:
    return ArraySpec() if cls is np.ndarray else Opaque()


def _latin1(text: Any, encoding: str = "utf-8") -> _Latin1Text:
    return _Latin1Text()


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "dtype"): np.dtype,
    ("numpy", "ndarray"): np.ndarray,
    ("_codecs", "encode"): _latin1,
}
for _pkg in ("numpy.core", "numpy._core"):
    _ALLOWED[(f"{_pkg}.numeric", "_frombuffer")] = _frombuffer
    _ALLOWED[(f"{_pkg}.multiarray", "_reconstruct")] = _reconstruct
_TEXT_PLACEHOLDER_MIN = 4096


class InspectUnpickler(SpanUnpickler):
    """A :class:`SpanUnpickler` that runs no code and reads no bulk payload.

    Only numpy's array and dtype reconstruction globals (both the 1.x ``numpy.core`` and the 2.x
    ``numpy._core`` spellings) and ``_codecs.encode`` are known, and they build
    :class:`ArraySpec` records instead of arrays; any other global is an :class:`Opaque`. ``bytes`` / ``bytearray`` payloads of at least ``bytes_min`` bytes
    and text payloads of at least 4 KiB become :class:`Payload` placeholders and are skipped.
    """

    dispatch: ClassVar[dict[int, Any]] = dict(SpanUnpickler.dispatch)

    def __init__(self, file: SpanFile, *, bytes_min: int = 0, **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._bytes_min = bytes_min

    def find_class(self, module: str, name: str) -> Any:
        return _ALLOWED.get((module, name)) or Opaque()

    def get_extension(self, code: int) -> None:
        # copyreg's registry read as data; its cache holds real imported objects: never read
        # from it (calling one would run code), never fill it with stand-ins
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        if not key:
            raise pickle.UnpicklingError(f"unregistered extension code {code}")
        self.append(self.find_class(*key))

    def _payload(self, n: int, kind: str, make: Callable[[bytes], Any]) -> None:
        if n < (self._bytes_min if kind != "text" else _TEXT_PLACEHOLDER_MIN):
            self.append(make(self.read(n)))
        elif n < _TEXT_PLACEHOLDER_MIN:
            offset = self.span.offset
            self.append(Payload.make(self.read(n), offset, n, kind))
        else:
            self.append(Payload.make(b"", self.span.offset, n, kind))
            self.span.skip(n)

    def load_short_binbytes(self) -> None:
        self._payload(self.read(1)[0], "bytes", bytes)

    def load_binbytes(self) -> None:
        self._payload(U4(self.read(4))[0], "bytes", bytes)

    def load_binbytes8(self) -> None:
        self._payload(U8(self.read(8))[0], "bytes", bytes)

    def load_bytearray8(self) -> None:
        self._payload(U8(self.read(8))[0], "bytearray", bytearray)

    def load_binstring(self) -> None:
        n = I4(self.read(4))[0]
        if n < 0:
            raise pickle.UnpicklingError("BINSTRING pickle has negative byte count")
        self._payload(n, "text", self._decode_string)

    def load_binunicode(self) -> None:
        self._payload(U4(self.read(4))[0], "text", lambda b: str(b, "utf-8", "surrogatepass"))

    def load_binunicode8(self) -> None:
        self._payload(U8(self.read(8))[0], "text", lambda b: str(b, "utf-8", "surrogatepass"))

    dispatch[pickle.SHORT_BINBYTES[0]] = load_short_binbytes
    dispatch[pickle.BINBYTES[0]] = load_binbytes
    dispatch[pickle.BINBYTES8[0]] = load_binbytes8
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8
    dispatch[pickle.BINUNICODE[0]] = load_binunicode
    dispatch[pickle.BINSTRING[0]] = load_binstring
    dispatch[pickle.BINUNICODE8[0]] = load_binunicode8


@dataclass(frozen=True)
class SharedTable:
    """The memo entries some element uses but another element defines, for one file.

    ``keys[j]`` (sorted memo keys) is defined inside ``elements[element_of[j]]``, an element
    given as ``(start, end, memo_base, ext_keys)``: replaying that whole span (with its own
    externals, themselves in this table) and reading its memo yields the value.
    """

    keys: tuple[int, ...] = ()
    element_of: tuple[int, ...] = ()
    elements: tuple[tuple[int, int, int, tuple[int, ...]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "element_of": list(self.element_of),
            "elements": [[s, e, b, list(x)] for s, e, b, x in self.elements],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SharedTable:
        elements = tuple((int(s), int(e), int(b), tuple(x)) for s, e, b, x in obj["elements"])
        return cls(tuple(obj["keys"]), tuple(obj["element_of"]), elements)

    def element(self, key: int) -> int:
        """Index into ``elements`` of the element defining memo key ``key``."""
        j = bisect_left(self.keys, key)
        if j == len(self.keys) or self.keys[j] != key:
            raise KeyError(f"memo key {key} is not in the shared table")
        return self.element_of[j]


class MemoRefusal(Exception):
    """A memo reference that no element span can satisfy; ``offset`` says where."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(reason)
        self.reason, self.offset = reason, offset


_CHUNK = 1 << 15  # elements whose memo references are resolved at a time


def sorted_unique(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_index=True)`` of a 1-D integer array, by a stable sort: numpy 2's
    hash-based ``np.unique`` is 10-100x slower on the long, mostly sorted offset and key arrays
    of a scan."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    keep = np.ones(len(xs), bool)
    np.not_equal(xs[1:], xs[:-1], out=keep[1:])
    return xs[keep], order[keep]


def _unique_pairs(first: np.ndarray, second: np.ndarray, bound: int) -> np.ndarray:
    """Sorted unique rows of ``(first, second)`` (``0 <= second < bound``), shape ``(n, 2)``."""
    if not len(first):
        return np.zeros((0, 2), np.int64)
    bound = max(bound, 1)
    if int(first.max()) < (1 << 62) // bound:  # one int64 per pair: a 1-D unique, 10x faster
        flat = sorted_unique(first.astype(np.int64) * bound + second)[0]
        return np.stack([flat // bound, flat % bound], axis=1)
    return np.unique(np.stack([first, second], axis=1), axis=0)


class ElementTable:
    """Disjoint element spans of a file and the memo keys each needs from before its start.

    Built from sorted ``starts`` / ``ends``, the file's memo definition offsets ``defs`` (by
    key) and its GET opcodes (``get_offs``, ``get_keys``). ``base[e]`` is the number of memo
    definitions before ``starts[e]``; element ``e``'s externals are
    ``ext_keys[ext_offsets[e]:ext_offsets[e + 1]]`` (sorted, unique). Raises
    :class:`MemoRefusal` when spans overlap or an external is defined outside every element.
    """

    def __init__(
        self,
        starts: np.ndarray,
        ends: np.ndarray,
        defs: np.ndarray,
        get_offs: np.ndarray,
        get_keys: np.ndarray,
    ) -> None:
        if len(starts) > 1 and (ends[:-1] > starts[1:]).any():
            bad = int(np.flatnonzero(ends[:-1] > starts[1:])[0])
            raise MemoRefusal(
                "one element's bytes lie inside another's (a field aliasing another field's items)",
                int(starts[bad + 1]),
            )
        self.starts, self.ends, self.defs = starts, ends, defs
        self.base = np.searchsorted(defs, starts, "left").astype(np.int64)
        counts = np.zeros(len(starts), np.int64)
        parts = []
        # GETs come in file order: taken _CHUNK elements at a time, each chunk's sorted unique
        # (element, key) pairs follow the last chunk's, and temporaries stay chunk-sized
        cuts = np.searchsorted(get_offs, starts[_CHUNK::_CHUNK]).tolist()
        for k, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, len(get_offs)], strict=True)):
            first, last = k * _CHUNK, min((k + 1) * _CHUNK, len(starts))
            e = self.locate(get_offs[lo:hi])
            inside = e >= 0
            e, keys = e[inside], get_keys[lo:hi][inside]
            external = defs[keys] < starts[e]
            pairs = _unique_pairs(e[external], keys[external], len(defs))
            counts[first:last] += np.bincount(pairs[:, 0] - first, minlength=last - first)
            parts.append(pairs[:, 1].astype(np.int64))
            del e, inside, keys, external, pairs
        self.ext_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.ext_keys = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        del parts, counts
        used = np.zeros(len(defs), bool)  # keys index defs: a mask beats sorting them all
        used[self.ext_keys] = True
        self.shared_keys = np.flatnonzero(used).astype(np.int64)
        del used
        self.definer = self.locate(defs[self.shared_keys])
        if (self.definer < 0).any():
            key = int(self.shared_keys[np.flatnonzero(self.definer < 0)[0]])
            raise MemoRefusal(
                f"an element refers to memo key {key}, which is defined outside every sample (a reference to the dataset's own containers)",
                int(defs[key]),
            )

    def locate(self, offsets: np.ndarray) -> np.ndarray:
        """Index of the element containing each offset, or -1."""
        e = np.searchsorted(self.starts, offsets, "right") - 1
        ok = e >= 0
        ok[ok] = offsets[ok] < self.ends[e[ok]]
        return np.where(ok, e, -1)

    def externals(self, e: int) -> np.ndarray:
        return self.ext_keys[self.ext_offsets[e] : self.ext_offsets[e + 1]]

    def shared(self) -> SharedTable:
        used = np.unique(self.definer)
        index = {int(d): j for j, d in enumerate(used)}
        elements = tuple(
            (
                int(self.starts[d]),
                int(self.ends[d]),
                int(self.base[d]),
                tuple(int(k) for k in self.externals(int(d))),
            )
            for d in used
        )
        return SharedTable(
            tuple(int(k) for k in self.shared_keys),
            tuple(index[int(d)] for d in self.definer),
            elements,
        )
