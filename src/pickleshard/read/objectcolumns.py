"""Object fields decoded straight into a batch's columns, without building a sample.

A field read by span whose values keep to the common grammar (ints within int64, bools, floats,
str, bytes, None, and lists, tuples and dicts of these, with their memo ops, protocols 2-5) is
decoded by a stack machine that never builds the value: it emits the value's *shape* as tokens
(postfix: a leaf's kind; a list or dict opened, then each ``APPENDS``/``SETITEMS`` with its
count; a tuple with its count) and writes its leaves, in stream order, into slot ``j`` of the
batch's leaf table (``vals``: int64 ``(slots, B)``, a float as its bits, a bool as 0/1; ``objs``:
the str, bytes and None values). The first sample decoded sets the batch's shape; every later
one must give the same tokens and the same dict keys, else the decoder declines and that part
of the batch is read the present way (:meth:`SpanReader.many
<pickleshard.read.SpanReader.many>`, then ``default_collate``): never wrong data.

:class:`ReferenceDecoder` is the decoder in Python, the twin of the compiled
``_cscan.ObjectDecoder`` (same tokens, leaves, sizes and answers); :class:`ObjectColumn` turns a
decoder's table into the values (``batch[k]``) or straight into what ``default_collate`` gives
for them (:meth:`ObjectColumn.collated`); :class:`ObjectFill` is one file's part of a batch read.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import PickleshardError
from ..picklekit.compiled import CORE
from ..picklekit.externals import UnresolvableMemoId
from .ints import IntColumn
from .plan import INT, SPAN, ReadPlan
from .reader import Opened, SpanReader

__all__ = [
    "OD_DECLINE",
    "OD_EXTERNAL",
    "OD_OK",
    "OD_SHORT",
    "TOKENS",
    "NotCollatable",
    "ObjectColumn",
    "ObjectFill",
    "ReferenceDecoder",
    "shape_tree",
]

# tokens (the compiled decoder's TK_*; a closing token is its kind | count << SHIFT)
INT_, FLOAT, BOOL, STR, BYTES, NONE, LIST, DICT, APPENDS, SETITEMS, TUPLE = range(1, 12)
SHIFT = 8
TOKENS = {
    "INT": INT_, "FLOAT": FLOAT, "BOOL": BOOL, "STR": STR, "BYTES": BYTES, "NONE": NONE,
    "LIST": LIST, "DICT": DICT, "APPENDS": APPENDS, "SETITEMS": SETITEMS, "TUPLE": TUPLE,
    "SHIFT": SHIFT,
}  # fmt: skip
OD_OK, OD_EXTERNAL, OD_DECLINE, OD_SHORT = range(4)  # a decoder's answers
_OBJECT_LEAVES = (STR, BYTES, NONE)
_SPAN_MAX = 1 << 26  # longer spans are left to the reference
_INT64 = 1 << 63


class _Decline(Exception):
    """The span is outside the grammar, or not of the batch's shape."""


class _External(Exception):
    def __init__(self, key: int) -> None:
        self.key = key


def _uint(b: bytes, pos: int, n: int) -> int:
    if pos + n > len(b):
        raise _Decline
    return int.from_bytes(b[pos : pos + n], "little")


class ReferenceDecoder:
    """The compiled ``_cscan.ObjectDecoder`` in Python (see the module): the same attributes
    (``schema``, ``kinds``, ``vals``, ``objs``, ``keys``, ``sizes``, ``height``, ``filled``) and
    :meth:`decode`, with the file read by ``read(offset, n)`` and its identity checked by
    ``check(labels)`` (None: not) instead of a descriptor and a loader."""

    def __init__(self, size: int) -> None:
        self.size, self.nleaves, self.height = size, 0, 0
        self.schema: list[int] | None = None
        self.kinds: list[int] = []
        self.vals = np.zeros((0, size), np.int64)
        self.objs: list[list[Any] | None] = []
        self.keys: list[Any] = []
        self.sizes = np.zeros(size, np.int64)
        self.filled = np.zeros(size, np.uint8)

    def decode(
        self,
        read: Callable[[int, int], bytes],
        check: Callable[[list[int]], None] | None,
        starts: np.ndarray,
        ends: np.ndarray,
        bases: np.ndarray,
        items: np.ndarray,
        rows: np.ndarray,
        shift: int,
        externals: dict[int, Any],
        labels: list[int],
        first: int,
    ) -> tuple[int, int, int, int, int]:
        """As the compiled ``ObjectDecoder.decode``: ``(answer, j, key, nbytes, largest)``."""
        m = len(items)
        spans = []
        for j in range(first, m):
            i = int(items[j])
            if not 0 <= rows[j] < self.size:
                raise IndexError(f"row {rows[j]} of {self.size}")
            s, e = int(starts[i]), int(ends[i])
            if not 0 < e - s <= _SPAN_MAX or s < 0:
                return OD_DECLINE, j, 0, 0, 0
            spans.append((s, e))
        if first == m:
            return OD_OK, m, 0, 0, 0
        datas, total = [], 0
        for j, (s, e) in enumerate(spans, first):
            data = read(s, e - s)
            if len(data) != e - s:
                return OD_SHORT, j, 0, total, 0
            datas.append(data)
            total += e - s
        if check is not None:
            check(labels[first:])
        largest = 0
        for j, data in enumerate(datas, first):
            i = int(items[j])
            try:
                self._sample(data, int(bases[i]), shift, externals, int(rows[j]))
            except _External as exc:
                return OD_EXTERNAL, j, exc.key, total, largest
            except _Decline:
                return OD_DECLINE, j, 0, total, largest
            largest = max(largest, int(self.sizes[rows[j]]))
        return OD_OK, m, 0, total, largest

    def _sample(  # noqa: C901 - one opcode table, as the compiled twin's
        self, p: bytes, base: int, shift: int, externals: dict[int, Any], row: int
    ) -> None:
        n, pos = len(p), 0
        stack: list[list[Any]] = []  # [kind, leaf, height]; a MARK is [None, -1, 0]
        marks: list[int] = []
        memo: dict[int, tuple[int, int]] = {}  # local id -> (kind, leaf); kind 0: a container
        leaves: list[tuple[int, int, Any]] = []  # (kind, bits, object)
        toks: list[int] = []
        size, mode, nmemo = 0, 0, 0

        def leaf(kind: int, bits: int, obj: Any) -> None:
            stack.append([kind, len(leaves), 0])
            leaves.append((kind, bits, obj))
            toks.append(kind)

        while pos < n:
            op = p[pos]
            pos += 1
            if op in (0x4B, 0x4D, 0x4A, 0x8A):  # BININT1, BININT2, BININT, LONG1
                ln = {0x4B: 1, 0x4D: 2, 0x4A: 4}.get(op)
                if ln is None:
                    ln = _uint(p, pos, 1)
                    pos += 1
                    if ln > 8:
                        raise _Decline
                if pos + ln > n:
                    raise _Decline
                v = int.from_bytes(p[pos : pos + ln], "little", signed=op in (0x4A, 0x8A))
                pos += ln
                size += 8
                leaf(INT_, v, None)
            elif op == 0x47:  # BINFLOAT
                if pos + 8 > n:
                    raise _Decline
                bits = struct.unpack(">q", p[pos : pos + 8])[0]
                pos += 8
                size += 8
                leaf(FLOAT, bits, None)
            elif op in (0x88, 0x89):
                size += 8
                leaf(BOOL, int(op == 0x88), None)
            elif op == 0x4E:
                size += 8
                leaf(NONE, 0, None)
            elif op in (0x8C, 0x58, 0x8D, 0x43, 0x42, 0x8E):
                ln = 1 if op in (0x8C, 0x43) else 4 if op in (0x58, 0x42) else 8
                k = _uint(p, pos, ln)
                pos += ln
                if k > n - pos:
                    raise _Decline
                raw = p[pos : pos + k]
                pos += k
                if op in (0x8C, 0x58, 0x8D):
                    try:
                        obj: Any = str(raw, "utf-8", "surrogatepass")
                    except UnicodeDecodeError:
                        raise _Decline from None
                    size += len(obj)
                    leaf(STR, 0, obj)
                else:
                    size += len(raw)
                    leaf(BYTES, 0, bytes(raw))
            elif op in (0x68, 0x6A):  # BINGET, LONG_BINGET
                ident = _uint(p, pos, 1 if op == 0x68 else 4) + shift
                pos += 1 if op == 0x68 else 4
                if ident < base:
                    if ident not in externals:
                        raise _External(ident)
                    size += self._external(externals[ident], leaf)
                else:
                    got = memo.get(ident - base)
                    if got is None or got[0] == 0:
                        raise _Decline
                    kind, bits, obj = leaves[got[1]]
                    size += len(obj) if kind in (STR, BYTES) else 8
                    leaf(kind, bits, obj)
            elif op in (0x94, 0x71, 0x72):  # MEMOIZE, BINPUT, LONG_BINPUT
                if not stack or stack[-1][0] is None:
                    raise _Decline
                if op == 0x94:
                    if mode == 2:
                        raise _Decline
                    mode, ident = 1, nmemo
                    nmemo += 1
                else:
                    if mode == 1:
                        raise _Decline
                    ln = 1 if op == 0x71 else 4
                    mode, ident = 2, _uint(p, pos, ln) + shift - base
                    pos += ln
                if not 0 <= ident < n:
                    raise _Decline
                kind = stack[-1][0]
                memo[ident] = (kind if kind <= NONE else 0, stack[-1][1])
            elif op == 0x95:  # FRAME
                if pos + 8 > n:
                    raise _Decline
                pos += 8
            elif op == 0x28:  # MARK
                marks.append(len(stack))
                stack.append([None, -1, 0])
            elif op in (0x5D, 0x7D, 0x29):
                kind = {0x5D: LIST, 0x7D: DICT, 0x29: TUPLE}[op]
                stack.append([kind, -1, 1])
                toks.append(kind)
            elif op in (0x61, 0x65, 0x73, 0x75, 0x74, 0x85, 0x86, 0x87):
                if op == 0x61:
                    a = len(stack) - 1
                elif op == 0x73:
                    a = len(stack) - 2
                elif op in (0x85, 0x86, 0x87):
                    a = len(stack) - (op - 0x84)
                else:
                    if not marks:
                        raise _Decline
                    a = marks.pop() + 1
                items = stack[a:]
                c = len(items)
                if a < 0 or any(e[0] is None for e in items):
                    raise _Decline
                h = max([e[2] for e in items if e[1] < 0], default=0)
                if op in (0x74, 0x85, 0x86, 0x87):
                    del stack[a - (op == 0x74) :]
                    stack.append([TUPLE, -1, h + 1])
                    size += 8 * c
                    toks.append(TUPLE | c << SHIFT)
                    continue
                at = a - 1 if op in (0x61, 0x73) else a - 2
                if at < 0:
                    raise _Decline
                if op in (0x61, 0x65):
                    if stack[at][0] != LIST:
                        raise _Decline
                    tok = APPENDS | c << SHIFT
                    size += 8 * c
                else:
                    if stack[at][0] != DICT or c % 2:
                        raise _Decline
                    for e in items[::2]:
                        if e[0] != STR:
                            raise _Decline
                        if self.schema is not None and self.keys[e[1]] != leaves[e[1]][2]:
                            raise _Decline
                    tok = SETITEMS | (c // 2) << SHIFT
                    size += 16 * (c // 2)
                stack[at][2] = max(stack[at][2], h + 1)
                del stack[at + 1 :]
                toks.append(tok)
            else:
                raise _Decline
            if (
                self.schema is not None
                and toks
                and (len(toks) > len(self.schema) or toks[-1] != self.schema[len(toks) - 1])
            ):
                raise _Decline
        if len(stack) != 1 or marks or (self.schema is not None and toks != self.schema):
            raise _Decline
        if self.schema is None:
            self._learn(toks, leaves, stack[0])
        for j, (_, bits, obj) in enumerate(leaves):
            self.vals[j, row] = bits
            col = self.objs[j]
            if col is not None:
                col[row] = obj
        self.sizes[row], self.filled[row] = size, 1

    @staticmethod
    def _external(o: Any, leaf: Callable[[int, int, Any], None]) -> int:
        """An external value as a leaf (its size), or a decline."""
        t = type(o)
        if t is int and -_INT64 <= o < _INT64:
            leaf(INT_, o, None)
            return 8
        if t is float:
            leaf(FLOAT, struct.unpack("<q", struct.pack("<d", o))[0], None)
            return 8
        if t is bool:
            leaf(BOOL, int(o), None)
            return 8
        if t is str or t is bytes:
            leaf(STR if t is str else BYTES, 0, o)
            return len(o)
        if o is None:
            leaf(NONE, 0, None)
            return 8
        raise _Decline

    def _learn(self, toks: list[int], leaves: list[tuple[int, int, Any]], top: list[Any]) -> None:
        self.schema, self.nleaves = toks, len(leaves)
        self.kinds = [k for k, _, _ in leaves]
        self.vals = np.zeros((len(leaves), self.size), np.int64)
        self.objs = [[None] * self.size if k in _OBJECT_LEAVES else None for k in self.kinds]
        self.keys = _key_slots(toks, [o for _, _, o in leaves])
        self.height = top[2] if top[1] < 0 else 0


def _key_slots(schema: list[int], objs: list[Any]) -> list[Any]:
    """Per leaf slot, the key it holds when it is a dict's key, else None."""
    stack: list[int] = []
    keys: list[Any] = [None] * len(objs)
    leaf = 0
    for t in schema:
        kind, c = t & ((1 << SHIFT) - 1), t >> SHIFT
        if kind <= NONE:
            stack.append(leaf)
            leaf += 1
        elif kind in (LIST, DICT):
            stack.append(-1)
        elif kind == TUPLE:
            if c:
                del stack[len(stack) - c :]
            stack.append(-1)
        elif kind == APPENDS:
            del stack[len(stack) - c :]
        else:
            for k in stack[len(stack) - 2 * c :: 2]:
                keys[k] = objs[k]
            del stack[len(stack) - 2 * c :]
    return keys


# -- the shape as a tree, and what default_collate makes of it ---------------------------------

Node = tuple[
    Any, ...
]  # ("leaf", kind, slot) | ("list"|"tuple", children) | ("dict", keys, children)


def shape_tree(schema: list[int], keys: list[Any]) -> Node | None:
    """The tree of a decoder's shape (leaf slots numbered in stream order), or None where a
    dict repeats a key (the unpickled dict keeps the last value: the reference reads it)."""
    stack: list[Any] = []
    slot = 0
    for t in schema:
        kind, c = t & ((1 << SHIFT) - 1), t >> SHIFT
        if kind <= NONE:
            stack.append(("leaf", kind, slot))
            slot += 1
        elif kind == LIST:
            stack.append(["list", []])
        elif kind == DICT:
            stack.append(["dict", [], []])
        elif kind == TUPLE:
            kids = stack[len(stack) - c :] if c else []
            del stack[len(stack) - c :]
            stack.append(["tuple", kids])
        elif kind == APPENDS:
            kids = stack[len(stack) - c :]
            del stack[len(stack) - c :]
            stack[-1][1].extend(kids)
        else:
            pairs = stack[len(stack) - 2 * c :]
            del stack[len(stack) - 2 * c :]
            for k, v in zip(pairs[::2], pairs[1::2], strict=True):
                stack[-1][1].append(keys[k[2]])
                stack[-1][2].append(v)
    top = stack[0]
    return _freeze(top)


def _freeze(node: Any) -> Node | None:
    if node[0] == "leaf":
        return tuple(node)
    kids = [_freeze(k) for k in node[-1]]
    if any(k is None for k in kids):
        return None
    if node[0] == "dict":
        if len(set(node[1])) != len(node[1]):
            return None
        return ("dict", tuple(node[1]), tuple(kids))
    return (node[0], tuple(kids))


class NotCollatable(Exception):
    """``default_collate`` raises for these values (a None): collate them, to raise it."""


class ObjectColumn:
    """A field of a batch held by a decoder's table (see the module)."""

    __slots__ = ("_tree", "_values", "decoder")

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        self._tree: Node | None | bool = False  # False: not built yet
        self._values: list[Any] | None = None

    @property
    def tree(self) -> Node | None:
        """The batch's shape (None: not decoded, or not usable)."""
        if self._tree is False:
            d = self.decoder
            self._tree = None if d.schema is None else shape_tree(list(d.schema), list(d.keys))
        return self._tree  # type: ignore[return-value]

    def __len__(self) -> int:
        return int(self.decoder.size)

    def values(self) -> list[Any]:
        """Every row's value, as unpickling its span gives it (a row not decoded: None)."""
        if self._values is None:
            d, tree = self.decoder, self.tree
            if tree is None:
                self._values = [None] * d.size
            else:
                got = _values(tree, d)
                if not d.filled.all():
                    got = [v if f else None for v, f in zip(got, d.filled.tolist(), strict=True)]
                self._values = got
        return self._values

    def value(self, k: int) -> Any:
        return self.values()[k]

    def collated(self, torch: Any) -> Any:
        """What ``default_collate`` gives for this field of the batch (its values in a
        tuple); :class:`NotCollatable` where it raises."""
        tree = self.tree
        if tree is None or not self.decoder.filled.all():
            raise NotCollatable
        return _collate(torch, tree, self.decoder, tuple)


def _int_run(kids: tuple[Node, ...]) -> tuple[int, int] | None:
    """Slots ``a:b`` when ``kids`` are int leaves in consecutive slots."""
    if not kids or any(k[0] != "leaf" or k[1] != INT_ for k in kids):
        return None
    a = kids[0][2]
    if any(k[2] != a + j for j, k in enumerate(kids)):
        return None
    return a, a + len(kids)


def _values(node: Node, d: Any) -> list[Any]:
    size = d.size
    if node[0] == "leaf":
        kind, slot = node[1], node[2]
        if kind == INT_:
            return d.vals[slot].tolist()  # type: ignore[no-any-return]
        if kind == FLOAT:
            return d.vals[slot].view(np.float64).tolist()  # type: ignore[no-any-return]
        if kind == BOOL:
            return d.vals[slot].astype(bool).tolist()  # type: ignore[no-any-return]
        return list(d.objs[slot])
    if node[0] == "dict":
        keys, kids = node[1], node[2]
        if not kids:
            return [{} for _ in range(size)]
        return [dict(zip(keys, t, strict=True)) for t in zip(*[_values(k, d) for k in kids])]
    kids = node[1]
    run = _int_run(kids)
    if node[0] == "list":
        if run is not None:
            return d.vals[run[0] : run[1]].T.tolist()  # type: ignore[no-any-return]
        if not kids:
            return [[] for _ in range(size)]
        return [list(t) for t in zip(*[_values(k, d) for k in kids])]
    if not kids:
        return [() for _ in range(size)]
    return list(zip(*[_values(k, d) for k in kids]))


def _collate(torch: Any, node: Node, d: Any, seq: type) -> Any:
    """``default_collate`` of this node's values held in a ``seq`` (a dict's values come in a
    list, a sequence's transposed items in tuples)."""
    if node[0] == "leaf":
        kind, slot = node[1], node[2]
        if kind == INT_:
            return torch.from_numpy(d.vals[slot])
        if kind == FLOAT:
            return torch.from_numpy(d.vals[slot].view(np.float64))
        if kind == BOOL:
            return torch.from_numpy(d.vals[slot].astype(np.bool_))
        if kind == NONE:
            raise NotCollatable
        return seq(d.objs[slot])
    if node[0] == "dict":
        return {k: _collate(torch, v, d, list) for k, v in zip(node[1], node[2], strict=True)}
    run = _int_run(node[1])
    if run is not None:
        return list(torch.from_numpy(d.vals[run[0] : run[1]]).unbind(0))
    return [_collate(torch, k, d, tuple) for k in node[1]]


# -- one file's part of a batch ------------------------------------------------------------------


class ObjectFill:
    """How one span-read file's samples are decoded into a batch's columns: its fields read by
    span decoded by the compiled :class:`ObjectDecoder` (one per field and batch, kept by the
    field's column), its int fields from their decoded values; :attr:`usable` only where every
    field is one of these, the file is local and the compiled core built."""

    def __init__(self, reader: SpanReader, here: Opened, plan: ReadPlan) -> None:
        self.reader, self.fd, self.loader = reader, here.fd, here.loader
        scan = reader.scan
        self.nfields = len(plan.hows)
        self.fields = [f for f, how in enumerate(plan.hows) if how == SPAN]
        self.ints: list[tuple[int, np.ndarray]] = []
        usable = CORE is not None and here.fd >= 0 and here.loader is not None and self.fields
        for f, how in enumerate(plan.hows):
            field = plan.readers[f]
            if how == INT and isinstance(field, IntColumn) and field.values is not None:
                self.ints.append((f, np.asarray(field.values, np.int64)))
            elif how != SPAN:
                usable = False
        shift = reader.spans.shifts.single
        self.usable = bool(usable) and shift is not None and not reader.spans.general
        self.shift = shift or 0
        self.externals: dict[int, Any] = {}  # external memo key -> value (this file's)
        # the file mapped whole: a span is a guarded copy out of it, not a system call
        self.mapped = _mapping(here.fd, reader.identity.size) if self.usable else None
        self.spans = [
            CORE.ObjectSpans(
                here.fd, here.loader if reader.verify else None, scan.starts[:, f],
                scan.ends[:, f], scan.memo_base[:, f], self.shift, self.externals, self.mapped,
            )  # fmt: skip
            for f in self.fields
        ] if self.usable and CORE is not None else []  # fmt: skip
        self.bounds = reader.bounds

    def fill(
        self, items: np.ndarray, labels: np.ndarray, rows: np.ndarray, columns: list[Any]
    ) -> bool:
        """Decode samples ``items`` (offset order) into rows ``rows`` of ``columns``; False
        (the caller reads them the present way) where any is outside the grammar or the
        batch's shape, or passes the bounds."""
        cols = [columns[f] for f in self.fields]
        if not self.usable or not all(c.decodable for c in cols):
            return False
        labels_l = labels.tolist()
        stats = self.reader.stats
        largest, height = 8 * self.nfields + 8 * len(self.ints), 0
        for col, src in zip(cols, self.spans, strict=True):
            dec = col.decoding(_new_column).decoder
            first = 0
            while True:
                answer, first, key, nbytes, big = dec.decode(src, items, rows, labels_l, first)
                stats.bytes_read += nbytes
                if answer != OD_EXTERNAL or not self._resolve(key):
                    break
            if answer != OD_OK or col.data.tree is None:
                return False
            largest += big
            height = max(height, dec.height)
        if self.bounds is not None:
            max_bytes, max_depth = self.bounds
            if (max_bytes is not None and largest > max_bytes) or (
                max_depth is not None and height and height + 1 > max_depth
            ):
                return False  # the reference reads them and names the sample
        for f, values in self.ints:
            columns[f].put_rows(rows, values[items])
        stats.fast_reads += len(items) * len(self.spans)
        return True

    def close(self) -> None:
        """Let go of the file's mapping (its reader is closing the file); returns None."""
        self.spans = []
        self.usable = False
        if self.mapped is not None:
            with contextlib.suppress(BufferError):  # a decode elsewhere may still hold it
                self.mapped.close()
            self.mapped = None

    def _resolve(self, key: int) -> bool:
        """Put external memo ``key``'s value in :attr:`externals`; False: it cannot be read
        here (the reference reads the sample and names the error)."""
        spans = self.reader.spans
        try:
            self.externals[key] = spans._external(key, spans._memos())
        except (PickleshardError, UnresolvableMemoId, LookupError):
            return False
        return True


def _mapping(fd: int, size: int) -> Any:
    """File ``fd`` mapped read-only (its first ``size`` bytes), or None where it cannot be."""
    if size <= 0:
        return None
    try:
        return mmap.mmap(fd, size, prot=mmap.PROT_READ)
    except (OSError, ValueError, OverflowError):
        return None  # read by pread


def _new_column(size: int) -> ObjectColumn:
    assert CORE is not None
    return ObjectColumn(CORE.ObjectDecoder(size))
