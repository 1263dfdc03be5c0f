"""The object-field decoder in Python: the reference of the compiled ``_cscan.ObjectDecoder``.

A span of the common value grammar (ints within int64, bools, floats, str, bytes, None, and
lists, tuples and dicts of these, with their memo ops, protocols 2-5) is decoded by a stack
machine that never builds the value: it emits the value's *shape* as tokens (postfix: a leaf's
kind; a list or dict opened, then each ``APPENDS``/``SETITEMS`` with its count; a tuple with its
count) and writes its leaves, in stream order, into slot ``j`` of the batch's leaf table
(``vals``: int64 ``(slots, B)``, a float as its bits, a bool as 0/1; ``objs``: the str, bytes and
None values). The first sample decoded sets the batch's shape; a later one of other tokens or
dict keys makes the batch ragged (:attr:`~ReferenceDecoder.ragged`): every row's value is built
from its tokens and leaves into :attr:`~ReferenceDecoder.rows`, the rows decoded before from the
table. Outside the grammar the decoder declines. Both twins give the same tokens,
leaves, sizes (as :func:`pickleshard.safety.bounds.measure` counts them) and answers;
:mod:`pickleshard.read.objectcolumns` uses them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "APPENDS", "BOOL", "BYTES", "DICT", "FLOAT", "INT_", "LIST", "NONE", "OD_DECLINE",
    "OD_EXTERNAL", "OD_OK", "OD_SHORT", "SETITEMS", "SHIFT", "STR", "TOKENS", "TUPLE",
    "ReferenceDecoder",
]  # fmt: skip

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
    """The span is outside the grammar."""


class _Reshape(_Decline):
    """The span is not of the batch's shape (its first sample's): the batch is ragged."""


class _External(Exception):
    def __init__(self, key: int) -> None:
        self.key = key


def _uint(b: bytes, pos: int, n: int) -> int:
    if pos + n > len(b):
        raise _Decline
    return int.from_bytes(b[pos : pos + n], "little")


class ReferenceDecoder:
    """The compiled ``_cscan.ObjectDecoder`` in Python (see the module): the same attributes
    (``schema``, ``kinds``, ``vals``, ``objs``, ``keys``, ``sizes``, ``height``, ``filled``,
    ``ragged``, ``rows``) and :meth:`decode`, with the file read by ``read(offset, n)`` and its identity checked by
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
        self.ragged = False  # its samples differ in shape: each row's value built (rows)
        self.rows: list[Any] | None = None

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
                try:
                    self._sample(data, int(bases[i]), shift, externals, int(rows[j]))
                except _Reshape:  # a ragged batch: every row's value built from now on
                    self._go_ragged()
                    self._sample(data, int(bases[i]), shift, externals, int(rows[j]))
            except _External as exc:
                return OD_EXTERNAL, j, exc.key, total, largest
            except _Decline:
                return OD_DECLINE, j, 0, total, largest
            largest = max(largest, int(self.sizes[rows[j]]))
        return OD_OK, m, 0, total, largest

    def _sample(  # one opcode table, as the compiled twin's
        self, p: bytes, base: int, shift: int, externals: dict[int, Any], row: int
    ) -> None:
        n, pos = len(p), 0
        stack: list[list[Any]] = []  # [kind, leaf, height]; a MARK is [None, -1, 0]
        marks: list[int] = []
        memo: dict[int, tuple[int, int]] = {}  # local id -> (kind, leaf); kind 0: a container
        leaves: list[tuple[int, int, Any]] = []  # (kind, bits, object)
        toks: list[int] = []
        size, mode, nmemo = 0, 0, 0
        schema = None if self.ragged else self.schema  # checked against (None: kept)

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
                        if schema is not None and self.keys[e[1]] != leaves[e[1]][2]:
                            raise _Reshape
                    tok = SETITEMS | (c // 2) << SHIFT
                    size += 16 * (c // 2)
                stack[at][2] = max(stack[at][2], h + 1)
                del stack[at + 1 :]
                toks.append(tok)
            else:
                raise _Decline
            if (
                schema is not None
                and toks
                and (len(toks) > len(schema) or toks[-1] != schema[len(toks) - 1])
            ):
                raise _Reshape
        if len(stack) != 1 or marks:
            raise _Decline
        if schema is not None and toks != schema:
            raise _Reshape
        if self.ragged:
            assert self.rows is not None
            self.rows[row] = _build(toks, leaves)
            top = stack[0]
            self.height = max(self.height, top[2] if top[1] < 0 else 0)
            self.sizes[row], self.filled[row] = size, 1
            return
        if self.schema is None:
            self._learn(toks, leaves, stack[0])
        for j, (_, bits, obj) in enumerate(leaves):
            self.vals[j, row] = bits
            col = self.objs[j]
            if col is not None:
                col[row] = obj
        self.sizes[row], self.filled[row] = size, 1

    def _go_ragged(self) -> None:
        """The rows decoded so far (the table's one shape) become their values in
        :attr:`rows`; every later sample's value is built as it is decoded."""
        assert self.schema is not None
        rows: list[Any] = [None] * self.size
        for r in np.flatnonzero(self.filled).tolist():
            leaves = [
                (kind, int(self.vals[j, r]), None if objs is None else objs[r])
                for j, (kind, objs) in enumerate(zip(self.kinds, self.objs, strict=True))
            ]
            rows[r] = _build(self.schema, leaves)
        self.rows, self.ragged = rows, True

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


def _build(toks: list[int], leaves: list[tuple[int, int, Any]]) -> Any:
    """The value of a sample of tokens ``toks`` and ``leaves`` (stream order), as unpickling
    its span builds it: the tokens replayed on a stack."""
    stack: list[Any] = []
    at = iter(leaves)
    for t in toks:
        kind, c = t & ((1 << SHIFT) - 1), t >> SHIFT
        if kind <= NONE:
            _, bits, obj = next(at)
            if kind == INT_:
                stack.append(bits)
            elif kind == FLOAT:
                stack.append(struct.unpack("<d", struct.pack("<q", bits))[0])
            elif kind == BOOL:
                stack.append(bool(bits))
            else:
                stack.append(obj)
        elif kind == LIST:
            stack.append([])
        elif kind == DICT:
            stack.append({})
        elif kind == TUPLE:
            stack.append(tuple(stack[len(stack) - c :]) if c else ())
            del stack[len(stack) - 1 - c : len(stack) - 1]
        elif kind == APPENDS:
            items = stack[len(stack) - c :]
            del stack[len(stack) - c :]
            stack[-1].extend(items)
        else:
            items = stack[len(stack) - 2 * c :]
            del stack[len(stack) - 2 * c :]
            for k, v in zip(items[::2], items[1::2], strict=True):
                stack[-1][k] = v
    (top,) = stack
    return top


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
