"""Scan a pickle file into per-sample byte spans, without unpickling it.

:func:`scan_file` walks the opcodes once (:func:`pickleshard.opcodes.walk_opcodes`, which seeks
over every payload), matches the top-level object against the layouts of
:mod:`pickleshard.layouts` with the same decisions and field names as
:func:`~pickleshard.layouts.decode_layout`, and reports, for sample ``i`` and field ``f``:

- ``kinds[f] == "pickle"``: ``[starts[i, f], ends[i, f])`` holds the opcodes that push that
  element plus what follows it up to the next element (its MEMOIZE/PUT, maybe a FRAME header).
  ``PROTO p`` + those bytes without FRAME headers + ``STOP``, unpickled with MEMOIZE counting
  from memo id ``memo_base[i, f] - shift`` and its externals resolved, equals
  ``decode_layout(pickle.load(file)).columns[f][i]``. ``shift`` is ``records[r, 2]`` for the
  record ``r`` holding the span (memo *keys* number every memo definition of the file in order;
  a record's own memo id ``m`` has key ``m + shift``).
- ``kinds[f] == "array_row"``: the field is one numpy array pickled at protocol 3+ and
  ``[starts[i, f], ends[i, f])`` are the raw bytes of its row ``i`` (``arrays[f]`` gives dtype and
  row shape); ``memo_base`` is -1.
- The externals of span ``(i, f)`` are ``ext_keys[ext_offsets[k]:ext_offsets[k + 1]]`` with
  ``k = i * F + f``: memo keys its GETs name that were defined before its start, each defined in
  one element of :class:`SharedTable`.

A file holding several pickles one after another (one ``pickle.dump`` call each) is read as
*chunks* when every pickle is itself a recognised layout (layout ``appended_<layout>``; they must
all have the same layout and fields, and samples are concatenated in file order), and otherwise
as *one sample per pickle*: layout ``appended_samples`` (an exact tuple gives fields ``x``,
``y``, ``f2``...; any other object is the single field ``x``) or ``appended_dict_samples``
(exact dicts; fields are the first one's keys). ``pickle.load`` called once per pickle, with
these rules, is the reference for both.

Not span-indexable (:class:`~pickleshard.errors.NotSpanIndexableError`, read the file whole):
protocols 0/1, persistent ids, out-of-band buffers, GETs of ids the pickle never stored (a
Pickler reused across dumps), a sample referring to the dataset's own containers, an array field
stored as protocol-2 text, in Fortran or permuted order or with object dtype, and any top-level
value whose type the scanner cannot establish without running code.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import opcodes as oc
from .errors import CorruptPickleError, FieldLengthMismatchError, NotSpanIndexableError
from .io import ByteSource, open_source, storage_read_bytes
from .layouts import MAX_LIST_FIELDS, default_field_names
from .memo import (
    WINDOW,
    ArraySpec,
    ElementTable,
    InspectUnpickler,
    MemoRefusal,
    NotInspectable,
    Opaque,
    SharedTable,
    SpanFile,
    sorted_unique,
)
from .opcodes import ITEMS, KIND, START, Node, Value, Walked
from .scanio import fetched_since, scan_buffer

__all__ = ["ENGINE", "ArrayItem", "ArrayRow", "IntItem", "ScanResult", "scan_bytes", "scan_file"]

_FORMAT = 1
# The opcode walker ``engine="auto"`` runs here: "compiled" when pickleshard._cscan is built.
ENGINE = oc.resolve_engine("auto")


@dataclass(frozen=True)
class ArrayRow:
    """How to read one row of an ``array_row`` field: ``row_shape`` items of ``dtype``, whose
    bytes are stored byte-swapped when ``swap`` (numpy < protocol 5 loads such arrays native)."""

    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    swap: bool = False

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        descr = np.lib.format.dtype_to_descr(self.dtype)
        return {"descr": descr, "row_shape": list(self.row_shape), "swap": self.swap}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ArrayRow:
        dtype = np.lib.format.descr_to_dtype(_tuples(obj["descr"]))
        return cls(dtype, tuple(obj["row_shape"]), bool(obj["swap"]))


@dataclass(frozen=True)
class ArrayItem:
    """How to read the samples of a ``pickle`` field whose elements are numpy arrays straight
    from their payloads, without unpickling: ``shape`` items of ``dtype`` (swapped from the stored
    order when ``swap``, read-only when ``readonly``, as :func:`pickle.load` leaves them) starting
    ``prefix`` bytes after the span's start. The samples in ``exceptions`` (sorted) are read by
    unpickling their span instead.

    The framing the scan proved every other sample has: ``head`` (the ``prefix`` bytes before
    the payload: opcodes, dtype and shape GETs, the payload's length) and ``tail`` (the bytes
    after it up to the span's end), equal in every such sample except the ``[lo, hi)`` ranges of
    ``head_masked`` / ``tail_masked`` (memo PUT ids, numbered per sample); a span 9 bytes longer
    holds one FRAME header at one of the ``bounds`` of ``tail``. A reader that reads the payload
    in place checks these bytes (:meth:`framing_matches`): the file's bytes changed if they
    differ."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    swap: bool
    readonly: bool
    prefix: int
    exceptions: tuple[int, ...]
    head: bytes
    tail: bytes
    head_masked: tuple[tuple[int, int], ...]
    tail_masked: tuple[tuple[int, int], ...]
    bounds: tuple[int, ...]

    def framing_matches(self, head: bytearray, tail: bytearray) -> bool:
        """Whether a sample's bytes before (``head``) and after (``tail``, to its span's end)
        its payload are the template's; ``head`` and ``tail`` may be changed (masked bytes)."""
        if len(tail) != len(self.tail):
            if len(tail) != len(self.tail) + 9:
                return False
            for b in self.bounds:  # the one FRAME header the pickler may have put here
                if tail[b] == oc.FRAME_OP and self.framing_matches(head, tail[:b] + tail[b + 9 :]):
                    return True
            return False
        for lo, hi in self.head_masked:
            head[lo:hi] = self.head[lo:hi]
        for lo, hi in self.tail_masked:
            tail[lo:hi] = self.tail[lo:hi]
        return head == self.head and tail == self.tail

    def to_json(self) -> dict[str, Any]:
        return {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "shape": list(self.shape),
            "swap": self.swap,
            "readonly": self.readonly,
            "prefix": self.prefix,
            "exceptions": list(self.exceptions),
            "head": self.head.hex(),
            "tail": self.tail.hex(),
            "head_masked": [list(r) for r in self.head_masked],
            "tail_masked": [list(r) for r in self.tail_masked],
            "bounds": list(self.bounds),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ArrayItem:
        """The stored form back; ValueError when its template does not hold together (an
        index is untrusted input: the reader relies on these lengths)."""
        dtype = np.lib.format.descr_to_dtype(_tuples(obj["descr"]))
        head, tail = bytes.fromhex(obj["head"]), bytes.fromhex(obj["tail"])
        head_masked = tuple((int(lo), int(hi)) for lo, hi in obj["head_masked"])
        tail_masked = tuple((int(lo), int(hi)) for lo, hi in obj["tail_masked"])
        bounds = tuple(int(b) for b in obj["bounds"])
        item = cls(
            dtype,
            tuple(obj["shape"]),
            bool(obj["swap"]),
            bool(obj["readonly"]),
            int(obj["prefix"]),
            tuple(int(i) for i in obj["exceptions"]),
            head,
            tail,
            head_masked,
            tail_masked,
            bounds,
        )
        if (
            len(head) != item.prefix
            or not 0 < len(head) + len(tail) <= _MAX_TEMPLATE
            or not all(0 <= lo < hi <= len(head) for lo, hi in head_masked)
            or not all(0 <= lo < hi <= len(tail) for lo, hi in tail_masked)
            or not all(0 <= b <= len(tail) for b in bounds)
        ):
            raise ValueError("an array item's framing template does not fit its prefix")
        return item


@dataclass(frozen=True)
class IntItem:
    """A ``pickle`` field whose every span is one ``BININT1``/``BININT2``/``BININT`` opcode
    (maybe followed by a FRAME header): its values are decoded from those few bytes."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "int"}


def _item_from_json(obj: dict[str, Any] | None) -> ArrayItem | IntItem | None:
    """An item back from the stored form; None for an array item stored without the framing
    template (no check possible: its samples are read by span)."""
    if obj is None:
        return None
    if obj.get("kind") == "int":
        return IntItem()
    return ArrayItem.from_json(obj) if "head" in obj else None


def _tuples(descr: Any) -> Any:
    """A dtype descr (``np.lib.format.dtype_to_descr``) back from JSON: its field entries and
    their names and shapes are tuples again (JSON made them lists)."""
    if not isinstance(descr, list):
        return descr
    out = []
    for entry in descr:
        name = tuple(entry[0]) if isinstance(entry[0], list) else entry[0]
        rest = [_tuples(entry[1])] + ([tuple(entry[2])] if len(entry) > 2 else [])
        out.append((name, *rest))
    return out


@dataclass(frozen=True)
class ScanResult:
    """The spans of every sample of one file; see the module docstring for what they mean.

    Per sample (shape ``(N, F)``, int64): ``starts``, ``ends``, ``memo_base``. CSR externals:
    ``ext_offsets`` (``N * F + 1``) and ``ext_keys``. Per file: ``records`` (``(R, 3)`` int64:
    start, end after STOP, memo-key shift of each pickle in the file), ``shared`` and the rest.
    ``bytes_read`` is how many bytes of the file the scan examined; ``bytes_fetched`` how many
    storage delivered to the scanning process meanwhile (readahead included; None where not
    measured: ``/proc/self/io`` missing, or bytes scanned). ``engine`` is the opcode
    walker that ran ("compiled" or "python"; empty when rebuilt from the stored form); it takes
    no part in comparisons, since both give equal results.
    """

    path: str
    size: int
    protocol: int
    layout: str
    fields: tuple[str, ...]
    kinds: tuple[str, ...]
    arrays: tuple[ArrayRow | None, ...]
    starts: np.ndarray
    ends: np.ndarray
    memo_base: np.ndarray
    ext_offsets: np.ndarray
    ext_keys: np.ndarray
    records: np.ndarray
    shared: SharedTable
    bytes_read: int
    engine: str = field(default="", compare=False)
    items: tuple[ArrayItem | IntItem | None, ...] = ()
    bytes_fetched: int | None = field(default=None, compare=False)

    @property
    def num_samples(self) -> int:
        return int(self.starts.shape[0])

    def externals(self, i: int, f: int) -> np.ndarray:
        k = i * len(self.fields) + f
        return self.ext_keys[self.ext_offsets[k] : self.ext_offsets[k + 1]]

    def meta(self) -> dict[str, Any]:
        """The per-file part, JSON-serialisable (the per-sample part is :meth:`arrays_dict`)."""
        plain = {k: getattr(self, k) for k in ("size", "protocol", "layout", "bytes_read")}
        if self.bytes_fetched is not None:
            plain["bytes_fetched"] = self.bytes_fetched
        return {
            **plain,
            "format": _FORMAT,
            "fields": list(self.fields),
            "kinds": list(self.kinds),
            "arrays": [a.to_json() if a is not None else None for a in self.arrays],
            "items": [a.to_json() if a is not None else None for a in self.items],
            "shared": self.shared.to_json(),
        }

    def arrays_dict(self) -> dict[str, np.ndarray]:
        """The numpy arrays to store as ``.npy``: the per-sample ones, and ``records``."""
        return {n: getattr(self, n) for n in _ARRAYS}

    @classmethod
    def from_stored(
        cls, path: str | os.PathLike[str], meta: dict[str, Any], arrays: dict[str, np.ndarray]
    ) -> ScanResult:
        """Rebuild from :meth:`meta` (after a JSON round trip) and :meth:`arrays_dict` (mmaps
        are fine); raises ``ValueError`` for a ``meta`` of another format version."""
        if meta.get("format") != _FORMAT:
            raise ValueError(f"scan format {meta.get('format')!r}, expected {_FORMAT}")
        plain: dict[str, Any] = {k: meta[k] for k in ("size", "protocol", "layout", "bytes_read")}
        return cls(
            path=os.fspath(path),
            fields=tuple(meta["fields"]),
            kinds=tuple(meta["kinds"]),
            arrays=tuple(ArrayRow.from_json(a) if a else None for a in meta["arrays"]),
            items=tuple(_item_from_json(a) for a in meta.get("items", ())),
            shared=SharedTable.from_json(meta["shared"]),
            starts=arrays["starts"],
            ends=arrays["ends"],
            memo_base=arrays["memo_base"],
            ext_offsets=arrays["ext_offsets"],
            ext_keys=arrays["ext_keys"],
            records=arrays["records"],
            bytes_fetched=meta.get("bytes_fetched"),
            **plain,
        )


_ARRAYS = ("starts", "ends", "memo_base", "ext_offsets", "ext_keys", "records")


class _NotLayout(Exception):
    """The object is not one of the layouts (the whole-file mode will say so precisely)."""


@dataclass
class _Field:
    """One column of one pickle: element spans, or array rows."""

    starts: np.ndarray
    ends: np.ndarray
    array: ArrayRow | None = None


def _item_starts(node: Node) -> np.ndarray:
    items = node[ITEMS]
    if type(items) is array:  # a complete node: item offsets only, as int64
        return np.frombuffer(items, np.int64)
    try:
        return np.array(items, np.int64)
    except (TypeError, ValueError):  # some items are nodes
        return np.fromiter((x if type(x) is int else x[START] for x in items), np.int64, len(items))


def _spans(nodes: Sequence[Node]) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of the items of ``nodes``, concatenated."""
    total = sum(len(n[ITEMS]) for n in nodes)
    if len(nodes) <= 16:  # a few big nodes (columns): whole arrays at a time
        starts = np.concatenate([_item_starts(n) for n in nodes] or [np.zeros(0, np.int64)])
    else:  # many small nodes (rows)
        starts = np.fromiter(
            (x if type(x) is int else x[START] for n in nodes for x in n[ITEMS]), np.int64, total
        )
    ends = np.empty(total, np.int64)
    ends[:-1] = starts[1:]
    base = 0
    for n in nodes:
        b, prev = n[oc.BOUNDS], 0
        for j in range(0, len(b), 2):
            if b[j] > prev:
                ends[base + b[j] - 1] = b[j + 1]
            prev = b[j]
        base += len(n[ITEMS])
    return starts, ends


def _kind(v: Value) -> int:
    return v[KIND] if type(v) is list else 0  # type: ignore[no-any-return,unused-ignore]


@dataclass
class _Cand:
    """A top-level object that matches a layout structurally (opaque fields still unchecked)."""

    layout: str
    values: list[Value]  # columns: the field values; rows: the row nodes
    ends: list[int]  # end offset of each value
    keys: list[tuple[int, int]]  # dict_columns: key spans


def _structure(root: Value, name: str) -> _Cand:
    """Mirror :func:`pickleshard.layouts.decode_layout` on the scanner's nodes."""
    if type(root) is not list or not root[ITEMS]:
        raise _NotLayout("the top-level object is not a non-empty list, tuple or dict")
    starts, ends = _spans([root])
    values, vends = list(root[ITEMS]), [int(e) for e in ends]
    if root[KIND] == oc.DICT:
        vals = values[1::2]
        if not all(_kind(v) != oc.DICT for v in vals):
            raise _NotLayout("a top-level dict whose values are not all sequences")
        keys = [(int(s), int(e)) for s, e in zip(starts[0::2], ends[0::2], strict=True)]
        return _Cand("dict_columns", vals, vends[1::2], keys)
    if root[KIND] == oc.TUPLE:
        if any(_kind(v) == oc.DICT for v in values):
            raise _NotLayout("a top-level tuple whose items are not all sequences")
        return _Cand("columns", values, vends, [])
    first = values[0]
    if _kind(first) == oc.TUPLE and first[ITEMS]:
        n = len(first[ITEMS])
        if all(_kind(r) == oc.TUPLE and len(r[ITEMS]) == n for r in values):
            return _Cand("rows", values, vends, [])
        if any(type(r) is int for r in values):
            raise NotSpanIndexableError(name, "a list of tuples with some rows of unknown type")
    if _kind(first) == oc.DICT:
        if all(_kind(r) == oc.DICT for r in values):
            return _Cand("dict_rows", values, vends, [])
        raise _NotLayout("a list of dicts with some rows of other types")
    if len(values) <= MAX_LIST_FIELDS and all(_kind(v) != oc.DICT for v in values):
        return _Cand("columns", values, vends, [])
    raise _NotLayout("a top-level list that is neither rows nor at most 64 columns")


_UNKNOWN = object()


class _Inspector:
    """Evaluates spans with :class:`InspectUnpickler` (no code run, payloads skipped).

    The memo of every element replayed to resolve an external is kept, so each is read once.
    """

    def __init__(self, buf: Any, w: Walked, table: ElementTable, encoding: str) -> None:
        self.buf, self.w, self.table, self.encoding = buf, w, table, encoding
        self.rec_starts = np.array([r[0] for r in w.records], np.int64)
        self.memos: dict[int, dict[int, Any] | None] = {}
        self.consts: dict[int, str] = {}
        self.bytes_read = 0
        self.window = WINDOW  # bytes per read of a span

    def _read_at(self, offset: int, n: int) -> bytes:
        return bytes(self.buf[offset : offset + n])

    def gather(self, at: np.ndarray, rel: np.ndarray) -> np.ndarray:
        """:func:`_gathered` of this file, by the walk's engine."""
        if self.w.engine == "compiled":
            from ._cscan import gather

            at, rel = at.astype(np.int64, copy=False), rel.astype(np.int64, copy=False)
            return gather(self.buf, at, rel, oc._releaser(self.buf))  # type: ignore[no-any-return]
        return _gathered(self.buf, at, rel)

    def _shift(self, offset: int) -> int:
        return self.w.records[int(np.searchsorted(self.rec_starts, offset, "right")) - 1][2]

    def load(self, start: int, end: int, bytes_min: int = 0) -> tuple[Any, dict[int, Any]]:
        shift = self._shift(start)
        first = int(np.searchsorted(self.table.defs, start)) - shift
        span = SpanFile(self._read_at, start, end, self.w.protocol, window=self.window)
        u = InspectUnpickler(
            span,
            bytes_min=bytes_min,
            first_id=first,
            resolve=lambda i: self._external(i + shift),
            encoding=self.encoding,
        )
        try:
            value = u.load()
        finally:
            self.bytes_read += span.bytes_read
        return value, {i + shift: v for i, v in u.memo.items()}

    def _external(self, key: int) -> Any:
        e = int(self.table.locate(self.table.defs[key : key + 1])[0])
        if e < 0 or (e in self.memos and self.memos[e] is None):
            raise NotInspectable(f"memo key {key} is not defined by an element before its use")
        memo = self.memos.get(e)
        if memo is None:
            self.memos[e] = None
            memo = self.memos[e] = self.load(int(self.table.starts[e]), int(self.table.ends[e]))[1]
        return memo[key]

    def value(self, start: int, end: int, bytes_min: int = 0) -> Any:
        try:
            return self.load(start, end, bytes_min)[0]
        except Exception:  # anything the inspector cannot evaluate is of unknown type
            return _UNKNOWN

    def key(self, start: int, end: int) -> Any:
        """A dict key's value; short strings and GETs of them are decoded without an unpickler."""
        buf, op = self.buf, self.buf[start]
        if op in (oc.SHORT_BINUNICODE_OP, oc.BINUNICODE_OP):
            hdr = 2 if op == oc.SHORT_BINUNICODE_OP else 5
            stop = start + hdr + (buf[start + 1] if hdr == 2 else oc.U4(buf, start + 1)[0])
            tail = end - stop
            if tail == 0 or (tail in _MEMO_TAIL and buf[stop] == _MEMO_TAIL[tail]):
                try:
                    value = str(buf[start + hdr : stop], "utf-8", "surrogatepass")
                except UnicodeDecodeError as exc:
                    raise CorruptPickleError(
                        self.w.name, f"a dict key is not UTF-8 text: {exc}", offset=start
                    ) from None
                self.consts[stop] = value
                return value
        if (op == oc.BINGET_OP and end - start == 2) or (
            op == oc.LONG_BINGET_OP and end - start == 5
        ):
            mid = buf[start + 1] if op == oc.BINGET_OP else oc.U4(buf, start + 1)[0]
            known = self.consts.get(int(self.table.defs[mid + self._shift(start)]))
            if known is not None:
                return known
        return self.value(start, end, bytes_min=4096)


_MEMO_TAIL = {1: oc.MEMOIZE_OP, 2: oc.BINPUT_OP, 5: oc.LONG_BINPUT_OP}
_KEY_TYPES = (str, bytes, int, float, complex, bool, type(None))


def _not_a_field(spec: Any) -> str | None:
    """Why an inspected top-level value is certainly not a field, or None if it may be one."""
    if isinstance(spec, ArraySpec):
        return None if spec.shape else "a 0-d numpy array is not a field"
    if spec is _UNKNOWN or isinstance(spec, (list, tuple, Opaque)):
        return None
    return f"a top-level field is a {type(spec).__name__}, not a sequence"


def _array_field(spec: ArraySpec, name: str) -> _Field:
    if spec.problem is not None or spec.payload is None or spec.dtype is None:
        raise NotSpanIndexableError(name, f"a field is a numpy array, but {spec.problem}")
    dtype = spec.dtype.newbyteorder("=") if spec.swap else spec.dtype
    row = ArrayRow(dtype, spec.shape[1:], spec.swap)
    starts = spec.payload.offset + np.arange(spec.shape[0], dtype=np.int64) * row.nbytes
    return _Field(starts, starts + row.nbytes, row)


def _leaves(cand: _Cand) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every element span of a candidate: items of its fields or rows, keys, opaque fields."""
    if cand.layout in ("rows", "dict_rows"):
        return [_spans(cand.values)]
    out = [_spans([v]) for v in cand.values if type(v) is list]
    opaque = [
        (oc.start_of(v), e) for v, e in zip(cand.values, cand.ends, strict=True) if type(v) is int
    ]
    out += [
        (np.array([s for s, _ in group], np.int64), np.array([e for _, e in group], np.int64))
        for group in (opaque, cand.keys)
        if group
    ]
    return out


def _dict_order(keys: list[Any], name: str) -> dict[Any, int]:
    """``{key: position}`` as a dict built from these keys in order would hold them."""
    order: dict[Any, int] = {}
    for j, k in enumerate(keys):
        if k is _UNKNOWN or type(k) not in _KEY_TYPES:
            raise NotSpanIndexableError(name, "a dict key the scanner cannot evaluate")
        try:
            order[k] = j
        except TypeError:
            raise NotSpanIndexableError(name, "an unhashable dict key") from None
    return order


def _fields(cand: _Cand, insp: _Inspector, name: str) -> tuple[tuple[str, ...], list[_Field]]:
    """Field names and columns of one pickle whose structure matched ``cand``."""
    if cand.layout == "rows":
        starts, ends = _spans(cand.values)
        n = len(cand.values[0][ITEMS])
        starts, ends = starts.reshape(-1, n), ends.reshape(-1, n)
        return default_field_names(n), [_Field(starts[:, f], ends[:, f]) for f in range(n)]
    if cand.layout == "dict_rows":
        return _dict_rows(cand.values, insp, name)
    values, vends = cand.values, cand.ends
    if cand.layout == "dict_columns":
        order = _dict_order([insp.key(s, e) for s, e in cand.keys], name)
        names = tuple(str(k) for k in order)
        values, vends = [values[j] for j in order.values()], [vends[j] for j in order.values()]
    else:
        names = default_field_names(len(values))
    opaque = {j: insp.value(v, vends[j]) for j, v in enumerate(values) if type(v) is not list}
    for why in filter(None, map(_not_a_field, opaque.values())):
        raise _NotLayout(why)
    if any(not isinstance(sp, ArraySpec) for sp in opaque.values()):
        raise NotSpanIndexableError(
            name, "a top-level field whose type the scanner cannot establish"
        )
    lengths = [
        len(v[ITEMS]) if type(v) is list else opaque[j].shape[0] for j, v in enumerate(values)
    ]
    if len(set(lengths)) > 1:
        detail = ", ".join(f"len({f}) = {n}" for f, n in zip(names, lengths, strict=True))
        raise FieldLengthMismatchError(name, f"fields have different lengths: {detail}")
    cols = [
        _Field(*_spans([v])) if type(v) is list else _array_field(opaque[j], name)
        for j, v in enumerate(values)
    ]
    return names, cols


def _dict_rows(
    rows: list[Node], insp: _Inspector, name: str
) -> tuple[tuple[str, ...], list[_Field]]:
    starts, ends = _spans(rows)
    picks: list[list[int]] = []
    base, keys0 = 0, None
    for row in rows:
        n = len(row[ITEMS])
        order = _dict_order(
            [insp.key(int(starts[base + j]), int(ends[base + j])) for j in range(0, n, 2)], name
        )
        if keys0 is None:
            keys0 = list(order)
        try:
            picks.append([base + 2 * order[k] + 1 for k in keys0])
        except KeyError as exc:
            raise _NotLayout(f"per-sample dicts with different keys (missing {exc})") from None
        base += n
    idx = np.array(picks, np.int64).reshape(len(rows), -1)
    return tuple(str(k) for k in keys0 or ()), [
        _Field(starts[idx[:, f]], ends[idx[:, f]]) for f in range(idx.shape[1])
    ]


def _table(w: Walked, leaves: list[tuple[np.ndarray, np.ndarray]]) -> ElementTable:
    starts = np.concatenate([s for s, _ in leaves]) if leaves else np.zeros(0, np.int64)
    ends = np.concatenate([e for _, e in leaves]) if leaves else np.zeros(0, np.int64)
    starts, first = sorted_unique(starts)
    as_np = [
        np.frombuffer(a, np.int64) if len(a) else np.zeros(0, np.int64)
        for a in (w.defs, w.get_offs, w.get_keys)
    ]
    try:
        return ElementTable(starts, ends[first], *as_np)
    except MemoRefusal as exc:
        raise NotSpanIndexableError(w.name, exc.reason, offset=exc.offset) from None


def _scan_chunks(buf: Any, w: Walked, stops: list[int], encoding: str) -> ScanResult:
    cands = [_structure(r, w.name) for r in w.roots]
    table = _table(w, [leaf for c in cands for leaf in _leaves(c)])
    insp = _Inspector(buf, w, table, encoding)
    parts = [_fields(c, insp, w.name) for c in cands]
    names, cols = parts[0]
    for r, (c, (n, cs)) in enumerate(zip(cands, parts, strict=True)):
        if (
            c.layout != cands[0].layout
            or n != names
            or [x.array for x in cs] != [x.array for x in cols]
        ):
            raise NotSpanIndexableError(
                w.name,
                f"appended pickle #{r + 1} differs from the first in layout, fields or array types",
                offset=w.records[r][0],
            )
    if len(parts) > 1:
        joined = [
            [
                np.concatenate([p[1][f].starts for p in parts]),
                np.concatenate([p[1][f].ends for p in parts]),
            ]
            for f in range(len(names))
        ]
        cols = [_Field(st, en, cols[f].array) for f, (st, en) in enumerate(joined)]
    layout = cands[0].layout if len(parts) == 1 else f"appended_{cands[0].layout}"
    # The GETs are in the table now, and _scan no longer falls back to _scan_samples (which
    # builds its own table from them): let them go before the biggest temporaries.
    w.get_offs, w.get_keys = array("q"), array("q")
    return _assemble(w, table, insp, layout, names, cols)


def _scan_samples(buf: Any, w: Walked, stops: list[int], encoding: str) -> ScanResult:
    first = w.roots[0]
    kind = (
        first[KIND]
        if type(first) is list and first[ITEMS] and first[KIND] in (oc.TUPLE, oc.DICT)
        else 0
    )
    if (
        not all(_kind(r) == kind and len(r[ITEMS]) == len(first[ITEMS]) for r in w.roots)
        if kind == oc.TUPLE
        else not all(_kind(r) == kind for r in w.roots)
        if kind == oc.DICT
        else False
    ):
        raise NotSpanIndexableError(w.name, "appended pickles are samples of different shapes")
    if kind:
        leaves = [_spans(w.roots)]
    else:
        leaves = [
            (np.array([oc.start_of(r) for r in w.roots], np.int64), np.array(stops, np.int64))
        ]
    table = _table(w, leaves)
    insp = _Inspector(buf, w, table, encoding)
    if kind == oc.DICT:
        names, cols = _dict_rows(w.roots, insp, w.name)
        return _assemble(w, table, insp, "appended_dict_samples", names, cols)
    n = len(first[ITEMS]) if kind else 1
    starts, ends = (leaves[0][0].reshape(-1, n), leaves[0][1].reshape(-1, n))
    names = default_field_names(n)
    return _assemble(
        w,
        table,
        insp,
        "appended_samples",
        names,
        [_Field(starts[:, f], ends[:, f]) for f in range(n)],
    )


def _externals(table: ElementTable, elem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR externals of every (sample, field) element ``elem`` of ``table`` (-1: none),
    in row-major order; gathered ``_ROWS`` samples at a time to keep temporaries small."""
    counts = np.zeros(elem.size, np.int64)
    if len(table.starts):
        flat = elem.ravel()
        np.subtract(
            table.ext_offsets[1:][flat], table.ext_offsets[:-1][flat], out=counts, where=flat >= 0
        )
    ext_offsets = np.zeros(elem.size + 1, np.int64)
    np.cumsum(counts, out=ext_offsets[1:])
    ext_keys = np.empty(int(ext_offsets[-1]), np.int64)
    nf = elem.shape[1]
    for lo in range(0, len(elem), _ROWS):
        a, b = lo * nf, min(len(elem), lo + _ROWS) * nf
        c = counts[a:b]
        if not c.any():
            continue
        pick = np.maximum(elem.ravel()[a:b], 0)
        base = ext_offsets[a:b]
        src = np.arange(int(base[0]), int(ext_offsets[b]), dtype=np.int64)
        src += np.repeat(table.ext_offsets[pick] - base, c)
        ext_keys[ext_offsets[a] : ext_offsets[b]] = table.ext_keys[src]
    return ext_offsets, ext_keys


_ROWS = 1 << 15  # samples whose externals are gathered at a time


def _assemble(
    w: Walked,
    table: ElementTable,
    insp: _Inspector,
    layout: str,
    names: tuple[str, ...],
    cols: list[_Field],
) -> ScanResult:
    n, nf = len(cols[0].starts), len(cols)
    starts = np.stack([c.starts for c in cols], axis=1).astype(np.int64).reshape(n, nf)
    ends = np.stack([c.ends for c in cols], axis=1).astype(np.int64).reshape(n, nf)
    elem = np.full((n, nf), -1, np.int64)
    for f, c in enumerate(cols):
        if c.array is None:
            elem[:, f] = np.searchsorted(table.starts, c.starts)
    ext_offsets, ext_keys = _externals(table, elem)
    items = tuple(
        _int_item(insp, starts[:, f], ends[:, f])
        or _array_item(
            insp, starts[:, f], ends[:, f], ext_offsets[f::nf], ext_offsets[f + 1 :: nf], ext_keys
        )
        if c.array is None and n >= 2 and len(w.records) == 1 and w.protocol >= 3
        else None
        for f, c in enumerate(cols)
    )
    return ScanResult(
        path=w.name,
        size=w.size,
        protocol=w.protocol,
        layout=layout,
        fields=names,
        kinds=tuple("pickle" if c.array is None else "array_row" for c in cols),
        arrays=tuple(c.array for c in cols),
        starts=starts,
        ends=ends,
        memo_base=np.where(
            elem >= 0, table.base[np.maximum(elem, 0)] if len(table.starts) else -1, -1
        ).astype(np.int64),
        ext_offsets=ext_offsets,
        ext_keys=ext_keys,
        records=np.array(w.records, np.int64).reshape(-1, 3),
        shared=table.shared(),
        bytes_read=w.size - w.skipped + insp.bytes_read,
        engine=w.engine,
        items=items if any(a is not None for a in items) else (),
    )


_MAX_EXCEPTIONS = 1024  # samples of a field read by span; beyond, the field has no ArrayItem
_MAX_TEMPLATE = 512  # bytes of a template span outside its payload
_CHUNK = 8192  # samples compared at a time


_BINARY_FORMS = (oc.F_FIXED, oc.F_LEN1, oc.F_LEN4S, oc.F_LEN4U, oc.F_LEN8U)


def _template_mask(
    buf: Any, start: int, pay: int, pay_end: int, end: int
) -> tuple[np.ndarray, list[int]] | None:
    """Which bytes of the template span outside its payload must be equal in another sample:
    all but memo PUT ids (numbering differs per sample); and the opcode boundaries after the
    payload (offsets from its end), where a FRAME header may stand in another sample. None if
    its opcodes do not end exactly at the payload and at ``end``."""
    mask = np.ones((pay - start) + (end - pay_end), bool)
    bounds = [0]
    for lo, hi, base in ((start, pay, 0), (pay_end, end, pay - start)):
        i = lo
        while i < hi:
            op = buf[i]
            if oc.FORM[op] not in _BINARY_FORMS:  # text forms (protocol 0 lines), bad bytes
                return None
            head = i + 1 + oc.ARGLEN[op]
            # the payload's own opcode ends at its header: its bytes follow
            nxt = pay if lo == start and head == pay else oc.opcode_end(buf, i)
            if oc.ACTION[op] == oc.A_PUT:
                mask[base + i + 1 - lo : base + nxt - lo] = False
            if nxt <= i or nxt > hi:
                return None
            i = nxt
            if lo == pay_end:
                bounds.append(i - pay_end)
    return mask, bounds


def _gathered(buf: Any, at: np.ndarray, rel: np.ndarray) -> np.ndarray:
    """``buf[at[k] + rel]`` for every ``k``, a ``(len(at), len(rel))`` uint8 array.

    An mmap is read 4 MiB of offsets at a time, each window's pages dropped from this process
    after it (as the opcode walk does, see :func:`pickleshard.opcodes._releaser`): touching a
    few bytes of every sample would otherwise map most of a file of big samples.
    """
    out = np.empty((len(at), len(rel)), np.uint8)
    if not len(at):
        return out
    order = np.argsort(at, kind="stable")
    cuts = np.flatnonzero(np.diff(at[order] >> oc.RELEASE_SHIFT)) + 1
    release = oc._releaser(buf)  # None for bytes and for mappings small enough to keep
    u8 = np.frombuffer(buf, np.uint8)
    try:
        for part in np.split(order, cuts):  # in offset order, so releases only move forward
            out[part] = u8[at[part][:, None] + rel]
            if release is not None:
                release(int(at[part[-1]]) + int(rel.max()) + 1)
    finally:
        del u8
    return out


def _int_item(insp: _Inspector, st: np.ndarray, en: np.ndarray) -> IntItem | None:
    """An :class:`IntItem` if every span of the field is one small-int opcode, else None."""
    lengths = en - st
    if int(lengths.max()) > 5 + 9:
        return None
    ops = insp.gather(st, np.zeros(1, np.int64))[:, 0]
    ok = np.zeros(len(st), bool)
    for op, size in oc.INT_SPAN.items():
        mine = ops == op
        framed = mine & (lengths == size + 9)
        ok |= mine & (lengths == size)
        ok[framed] = insp.gather(st[framed] + size, np.zeros(1, np.int64))[:, 0] == oc.FRAME_OP
    insp.bytes_read += len(st)
    return IntItem() if bool(ok.all()) else None


def _array_item(
    insp: _Inspector,
    st: np.ndarray,
    en: np.ndarray,
    ext_lo: np.ndarray,
    ext_hi: np.ndarray,
    ext_keys: np.ndarray,
) -> ArrayItem | None:
    """An :class:`ArrayItem` for a field whose spans are numpy arrays, or None.

    A *template* span (the first after sample 0 of the most common length) is inspected; a later
    sample is read straight from its payload when its span has the template's bytes outside the
    payload (memo PUT ids aside; optionally followed by one FRAME header) and the same externals:
    then its opcodes build the same kind of array from its own payload. Each GET names the same
    memo id as the template's; one that is internal to the template is external to a later
    sample, which then has other externals, so equal externals prove equal meaning. Earlier
    samples and any that differ are exceptions, read by span.
    """
    n = len(st)
    lengths = en - st
    values = np.sort(lengths[1:])  # the most common span length, without np.unique
    cut = np.flatnonzero(np.diff(values)) + 1
    counts = np.diff(np.concatenate([[0], cut, [len(values)]]))
    values = values[np.concatenate([[0], cut])]
    common = int(values[counts.argmax()])
    if (
        common - 9 in values
    ):  # the common length holds a FRAME header: the plain one is the template
        common -= 9
    t = 1 + int(np.argmax(lengths[1:] == common))
    s0, length = int(st[t]), int(lengths[t])
    insp.window = 1024  # small reads: never a payload it skips over
    try:
        spec = insp.value(s0, s0 + length)
    finally:
        insp.window = WINDOW
    if (
        not isinstance(spec, ArraySpec)
        or spec.problem is not None
        or spec.payload is None
        or spec.dtype is None
        or spec.payload.kind not in ("bytes", "bytearray")
    ):
        return None
    pay, plen = spec.payload.offset, spec.payload.length
    pre, post = pay - s0, length - (pay - s0) - plen
    if pre <= 0 or post < 0 or pre + post > _MAX_TEMPLATE:
        return None
    walked = _template_mask(insp.buf, s0, pay, pay + plen, s0 + length)
    if walked is None:
        return None
    mask, bounds = walked
    rel = np.concatenate([np.arange(pre), pre + plen + np.arange(post)]).astype(np.int64)
    # the same bytes with a 9-byte FRAME header at suffix boundary b: where each is found
    framed_rels = [(pre + plen + b, np.where(rel < pre + plen + b, rel, rel + 9)) for b in bounds]
    t_ext = ext_keys[ext_lo[t] : ext_hi[t]]
    cand = np.flatnonzero((lengths == length) | (lengths == length + 9))
    cand = cand[(cand > t) & ((ext_hi[cand] - ext_lo[cand]) == len(t_ext))]
    template = insp.gather(np.array([s0], np.int64), rel)[0]
    keep = []
    checked = 0
    for lo in range(0, len(cand), _CHUNK):  # chunks: temporaries of a few MB at most
        c = cand[lo : lo + _CHUNK]
        if len(t_ext):
            c = c[(ext_keys[ext_lo[c][:, None] + np.arange(len(t_ext))] == t_ext).all(axis=1)]
        checked += len(c)
        plain, framed = c[lengths[c] == length], c[lengths[c] != length]
        keep.append(plain[((insp.gather(st[plain], rel) == template) | ~mask).all(axis=1)])
        for at, where in framed_rels:
            got = insp.gather(st[framed], np.concatenate([[at], where]))
            ok = (got[:, 0] == oc.FRAME_OP) & ((got[:, 1:] == template) | ~mask).all(axis=1)
            keep.append(framed[ok])
            framed = framed[~ok]
    insp.bytes_read += checked * (pre + post + 1)
    direct = np.zeros(n, bool)
    direct[t] = True
    for c in keep:
        direct[c] = True
    exceptions = np.nonzero(~direct)[0]
    if len(exceptions) > _MAX_EXCEPTIONS:
        return None
    dtype = spec.dtype.newbyteorder("=") if spec.swap else spec.dtype
    readonly = spec.frombuffer and spec.payload.kind == "bytes"
    head, tail = template[:pre].tobytes(), template[pre:].tobytes()
    return ArrayItem(
        dtype,
        spec.shape,
        spec.swap,
        readonly,
        pre,
        tuple(exceptions.tolist()),
        head,
        tail,
        _ranges(~mask[:pre]),
        _ranges(~mask[pre:]),
        tuple(bounds),
    )


def _ranges(flags: np.ndarray) -> tuple[tuple[int, int], ...]:
    """The ``[lo, hi)`` runs of True in ``flags``."""
    edges = np.flatnonzero(np.diff(np.concatenate([[False], flags, [False]]).astype(np.int8)))
    return tuple((int(lo), int(hi)) for lo, hi in edges.reshape(-1, 2))


def _scan(buf: Any, size: int, name: str, encoding: str, engine: str) -> ScanResult:
    w = oc.walk_opcodes(buf, size, name, engine=engine)
    stops = [end - 1 for _, end, _ in w.records]
    try:
        return _scan_chunks(buf, w, stops, encoding)
    except (_NotLayout, FieldLengthMismatchError) as exc:
        if len(w.roots) == 1:
            if isinstance(exc, FieldLengthMismatchError):
                raise
            raise NotSpanIndexableError(
                name, f"{exc}; not a layout that can be read in place"
            ) from None
    try:
        return _scan_samples(buf, w, stops, encoding)
    except _NotLayout as exc:  # private: never past this module
        raise NotSpanIndexableError(name, f"{exc}; not samples that can be read in place") from None


def scan_file(
    path: str | os.PathLike[str] | ByteSource, *, encoding: str = "ASCII", engine: str = "auto"
) -> ScanResult:
    """Scan the pickle file at ``path`` (see the module docstring for what is reported).

    ``path`` is a path or URL (opened with :func:`pickleshard.io.open_source`, closed after) or
    an open :class:`~pickleshard.io.ByteSource` (left open). The source is advised as
    :func:`pickleshard.scanio.choose_pattern` decides, so a sparse scan fetches only the pages
    it examines. ``encoding`` decodes Python 2 ``str`` dict keys, as in :func:`pickle.load`.
    ``engine`` picks the opcode walker: ``"auto"`` (the compiled one when built, see
    :data:`ENGINE`), ``"compiled"`` or ``"python"`` (the reference); results and errors are the
    same. Raises :class:`~pickleshard.errors.NotSpanIndexableError` when the file must be read
    whole, and the other :class:`~pickleshard.errors.PickleshardError` classes for bad files.
    """
    source = path if isinstance(path, ByteSource) else open_source(path)
    before = storage_read_bytes()
    try:
        result = _scan(scan_buffer(source), source.size, source.name, encoding, engine)
    finally:  # the source's map goes with it
        if source is not path:
            source.close()
    return replace(result, bytes_fetched=fetched_since(before))


def scan_bytes(
    data: bytes, name: str = "<bytes>", *, encoding: str = "ASCII", engine: str = "auto"
) -> ScanResult:
    """:func:`scan_file` over bytes in memory; ``name`` is used in errors and as ``path``."""
    return _scan(data, len(data), name, encoding, engine)
