"""The pickle opcode table that the scanner and the span reader walk with: data, not a chain of ifs.

It is built once, at import, from :data:`pickletools.opcodes` (CPython's own description of every
opcode of protocols 0-5), so an opcode that CPython knows is never missing here. For every byte
value ``b`` there is one entry in each of these 256-long tables:

``FORM[b]``
    How the opcode's argument is laid out after the opcode byte: ``F_FIXED`` (``ARGLEN[b]``
    bytes, possibly 0), ``F_LEN1`` / ``F_LEN4S`` / ``F_LEN4U`` / ``F_LEN8U`` (a little-endian
    length prefix of 1, 4 (signed), 4 or 8 bytes, then that many payload bytes), ``F_LINE`` (up
    to and including a newline), ``F_LINE2`` (two such lines), or ``F_BAD`` (no such opcode).
``ARGLEN[b]``
    For ``F_FIXED`` the argument's size; for the ``F_LEN*`` forms the size of the length prefix.
``ACTION[b]``
    What the opcode does to the unpickler's stack, as one of the ``A_*`` constants below. Opcodes
    without a special meaning to the scanner get a generic action derived from pickletools'
    ``stack_before`` / ``stack_after``: ``A_PUSH`` (push one value), ``A_POPN`` (pop ``NPOP[b]``
    values, push one), ``A_MARKPOP`` (pop to the topmost MARK and ``NPOP[b]`` more values below
    it, push one).
``PAYLOAD[b]``
    ``P_BYTES`` / ``P_BYTEARRAY`` for opcodes whose payload becomes a ``bytes`` / ``bytearray``
    object as is (these may be read out of band), ``P_TEXT`` for other length-prefixed payloads
    (strings, long integers), else ``P_NONE``.

``REFUSED[b]`` names why an opcode makes a span unreadable on its own (persistent ids, out-of-band
buffers, ``DUP``), for the scanner's :class:`~pickleshard.errors.NotSpanIndexableError`.
"""

from __future__ import annotations

import functools
import gc
import io
import mmap
import os
import pickle
import pickletools
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .errors import (
    CorruptPickleError,
    EmptyPickleError,
    NotAPickleError,
    NotSpanIndexableError,
    TruncatedPickleError,
    UnreadableFileError,
)

__all__ = ["ACTION", "ARGLEN", "ENGINES", "FORM", "NPOP", "OPNAME", "PAYLOAD", "REFUSED"]
__all__ += ["compiled_walker", "fast_opcodes", "opcode_end", "resolve_engine", "walk_opcodes"]

F_BAD, F_FIXED, F_LEN1, F_LEN4S, F_LEN4U, F_LEN8U, F_LINE, F_LINE2 = range(8)
A_BAD, A_PUSH, A_POPN, A_MARKPOP, A_NOP, A_FRAME, A_PROTO, A_STOP, A_MARK = range(9)
A_POP, A_POP_MARK, A_MEMOIZE, A_PUT, A_GET, A_EMPTY_LIST, A_EMPTY_DICT = range(9, 16)
A_EMPTY_TUPLE, A_TUPLEN, A_TUPLE, A_LIST, A_DICT, A_APPEND, A_APPENDS = range(16, 23)
A_SETITEM, A_SETITEMS, A_REFUSE = range(23, 26)
P_NONE, P_BYTES, P_BYTEARRAY, P_TEXT = range(4)

_FORM_BY_N = {-1: F_LINE, -2: F_LEN1, -3: F_LEN4S, -4: F_LEN4U, -5: F_LEN8U}  # pickletools' n
_PREFIX_LEN = {F_LEN1: 1, F_LEN4S: 4, F_LEN4U: 4, F_LEN8U: 8}
# opcodes whose action is named like them (FRAME -> A_FRAME...), then families of opcodes
_SAME = "FRAME PROTO STOP MARK POP POP_MARK MEMOIZE EMPTY_LIST EMPTY_DICT EMPTY_TUPLE TUPLE LIST"
_SAME += " DICT APPEND APPENDS SETITEM SETITEMS"
_SPECIAL: dict[str, int] = {name: globals()[f"A_{name}"] for name in _SAME.split()}
_SPECIAL |= dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), A_PUT)
_SPECIAL |= dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), A_GET)
_SPECIAL |= dict.fromkeys(("TUPLE1", "TUPLE2", "TUPLE3"), A_TUPLEN)
_PERSID = "a persistent id ({}), resolved by the pickler's owner, not by the file"
_OUT_OF_BAND = "an out-of-band buffer ({}) whose bytes are not in the file"
_REFUSE_WHY = {
    **{name: _PERSID.format(name) for name in ("PERSID", "BINPERSID")},
    **{name: _OUT_OF_BAND.format(name) for name in ("NEXT_BUFFER", "READONLY_BUFFER")},
    "DUP": "a DUP opcode (one value in two places; CPython's pickler never writes it)",
}
_PAYLOAD_BY_ARG = dict.fromkeys(("bytes1", "bytes4", "bytes8"), P_BYTES) | {
    "bytearray8": P_BYTEARRAY
}

FORM: list[int] = [F_BAD] * 256
ARGLEN: list[int] = [0] * 256
ACTION: list[int] = [A_BAD] * 256
NPOP: list[int] = [0] * 256
PAYLOAD: list[int] = [P_NONE] * 256
OPNAME: list[str] = [f"<unknown 0x{b:02x}>" for b in range(256)]
REFUSED: dict[int, str] = {}


def _generic_action(op: pickletools.OpcodeInfo) -> tuple[int, int]:
    before = [s.name for s in op.stack_before]
    after = [s.name for s in op.stack_after]
    if len(after) > 1 or "mark" in after:
        raise AssertionError(f"opcode {op.name} needs a special action")
    if not after:
        return (A_NOP, 0) if not before else (A_BAD, 0)
    if "mark" in before:
        return A_MARKPOP, before.index("mark")
    return (A_POPN, len(before)) if before else (A_PUSH, 0)


for _op in pickletools.opcodes:
    _b = ord(_op.code.encode("latin-1"))
    OPNAME[_b] = _op.name
    _n, _arg = (_op.arg.n, _op.arg.name) if _op.arg is not None else (0, "")
    if _n >= 0:
        FORM[_b], ARGLEN[_b] = F_FIXED, _n
    else:
        FORM[_b] = F_LINE2 if _arg == "stringnl_noescape_pair" else _FORM_BY_N[_n]
        ARGLEN[_b] = _PREFIX_LEN.get(FORM[_b], 0)
        if FORM[_b] in _PREFIX_LEN:
            PAYLOAD[_b] = _PAYLOAD_BY_ARG.get(_arg, P_TEXT)
    if _op.name in _REFUSE_WHY:
        ACTION[_b], REFUSED[_b] = A_REFUSE, _REFUSE_WHY[_op.name]
    elif _op.name in _SPECIAL:
        ACTION[_b] = _SPECIAL[_op.name]
        NPOP[_b] = len(_op.stack_before) if ACTION[_b] == A_TUPLEN else 0
    else:
        ACTION[_b], NPOP[_b] = _generic_action(_op)
    if ACTION[_b] == A_BAD:
        raise AssertionError(f"no scanner action for opcode {_op.name}")

HIGHEST_PROTOCOL: Final = pickle.HIGHEST_PROTOCOL
PROTO_OP: Final = 0x80
# Total size of each fixed-size opcode that only pushes a value (the scanner's fast path), and of
# each fixed-size opcode the span rewriter copies as is (not a memo opcode, not FRAME, not one
# that names a global: the rewriter counts those); else 0.
PUSH_STEP: list[int] = [
    1 + ARGLEN[b] if ACTION[b] == A_PUSH and FORM[b] == F_FIXED else 0 for b in range(256)
]
# Opcodes whose loading calls the unpickler's ``find_class`` (they name a global).
FINDS_CLASS: list[bool] = [
    OPNAME[b] in ("GLOBAL", "STACK_GLOBAL", "INST", "EXT1", "EXT2", "EXT4") for b in range(256)
]
COPY_STEP: list[int] = [
    1 + ARGLEN[b]
    if FORM[b] == F_FIXED and ACTION[b] not in (A_BAD, A_GET, A_PUT, A_FRAME) and not FINDS_CLASS[b]
    else 0
    for b in range(256)
]
if any(ACTION[b] != A_PUSH for b in range(256) if FORM[b] in (F_LEN1, F_LEN4S, F_LEN4U, F_LEN8U)):
    raise AssertionError("the scanner assumes every length-prefixed opcode pushes one value")
STOP_OP, FRAME_OP, MEMOIZE_OP, NEXT_BUFFER_OP, POP_OP = 0x2E, 0x95, 0x94, 0x97, 0x30
BINPUT_OP, LONG_BINPUT_OP, BINGET_OP, LONG_BINGET_OP = 0x71, 0x72, 0x68, 0x6A
BININT1_OP, BININT_OP, BINPERSID_OP, SHORT_BINUNICODE_OP, BINUNICODE_OP = (
    0x4B,
    0x4A,
    0x51,
    0x8C,
    0x58,
)
BININT2_OP = 0x4D
# Size of a span that is one small-int opcode and its argument (BININT1, BININT2, BININT)
INT_SPAN: Final = {BININT1_OP: 2, BININT2_OP: 3, BININT_OP: 5}
U4, I4, U8 = (struct.Struct(f).unpack_from for f in ("<I", "<i", "<Q"))
RELEASE_SHIFT: Final = 22  # walks release mapped pages every 4 MiB (see _releaser)
KEEP_MAPPED: Final = 64 << 20  # files up to this size keep their pages mapped during a scan
Release = Callable[[int], None]


LIST, TUPLE, DICT = 1, 2, 3

# A node is a list, tuple or dict built on the scanner's stack, kept as a plain Python list
# (three times cheaper to make than an object) with these slots:
#   KIND    LIST, TUPLE or DICT
#   START   offset of the first opcode of the value
#   ITEMS   per item, its start offset (an int) or its own node; an array('q') of offsets
#           once the node is complete and itself an item of another node
#   BOUNDS  flat [count, end, count, end...]: after each batch (APPENDS, SETITEMS, TUPLE...) the
#           item count and the offset of the consuming opcode, which ends the batch's last item
#   SUB     indices of the items that are still nodes, or None. When a node becomes an item of
#           another, its own node items are turned into their start offsets: only two levels
#           below any node on the stack are kept, which is all a layout needs.
#   KEY     the memo key stored from this node, or -1
KIND, START, ITEMS, BOUNDS, SUB, KEY = range(6)
Node = list[Any]
Value = Any  # an int (start offset of an opaque value) or a Node


def start_of(v: Value) -> int:
    return v if type(v) is int else v[START]  # type: ignore[no-any-return,unused-ignore]


def _prune(node: Node, memo_nodes: dict[int, Node]) -> None:
    sub = node[SUB]
    if sub:
        items = node[ITEMS]
        for idx in sub:
            g = items[idx]
            if type(g) is list:
                items[idx] = g[START]
                if g[KEY] >= 0:
                    memo_nodes.pop(g[KEY], None)
    node[SUB] = None


def _claim(
    stack: list[Value], m: int, base: int, nodepos: list[int], memo: dict[int, Node]
) -> list[int]:
    """Nodes among ``stack[m:]`` become items (at ``base + j - m``) of another node: prune them."""
    sub = []
    while nodepos and nodepos[-1] >= m:
        j = nodepos.pop()
        kid = stack[j]
        _prune(kid, memo)
        if len(kid[ITEMS]) > 4:  # complete now, and only ints: 8 bytes an item instead of ~40
            kid[ITEMS] = array("q", kid[ITEMS])
        sub.append(base + j - m)
    return sub


def _adopt(
    target: Node, stack: list[Value], m: int, end: int, nodepos: list[int], memo: dict[int, Node]
) -> None:
    """Move ``stack[m:]`` into ``target``'s items; the last of them ends at ``end``."""
    items = target[ITEMS]
    if nodepos and nodepos[-1] >= m:
        if target[SUB] is None:
            target[SUB] = []
        target[SUB] += _claim(stack, m, len(items), nodepos, memo)
    items += stack[m:]
    del stack[m:]
    target[BOUNDS] += (len(items), end)


def _discard(stack: list[Value], m: int, nodepos: list[int], memo: dict[int, Node]) -> None:
    while nodepos and nodepos[-1] >= m:
        nd = stack[nodepos.pop()]
        if nd[KEY] >= 0:
            memo.pop(nd[KEY], None)
        _prune(nd, memo)
    del stack[m:]


@dataclass
class Walked:
    """The opcode-level facts of a whole file: one root per pickle record, and the memo."""

    name: str
    size: int
    protocol: int
    roots: list[Value]
    records: list[tuple[int, int, int]]  # (start, end after STOP, shift: memo key - memo id)
    defs: array[int]  # file offset of each memo definition, by memo key
    get_offs: array[int]  # file offset of each GET opcode
    get_keys: array[int]  # memo key it names
    skipped: int  # payload bytes seeked over, never read
    engine: str = "python"  # the walker that produced it: "python" or "compiled"


class _Refused(Exception):
    def __init__(self, reason: str, offset: int) -> None:
        self.reason, self.offset = reason, offset


class _Unsupported(Exception):
    """Raised by the compiled walker for what it leaves to this one (a huge text memo id)."""


def _cut(w: Walked, pos: int, what: str) -> TruncatedPickleError:
    return TruncatedPickleError(w.name, f"stream ends inside {what}", offset=pos)


def _bad(w: Walked, pos: int, op: int, what: str) -> CorruptPickleError:
    return CorruptPickleError(w.name, f"{OPNAME[op]} {what}", offset=pos)


def _walk_record(
    buf: Any, pos: int, end: int, w: Walked, release: Release | None = None
) -> tuple[Value, int, int]:
    """Walk one pickle from just after its PROTO to its STOP; return (root, end, first id).

    The hot loop: one table lookup and one ``list.append`` for the common fixed-size pushes,
    a length read and a seek for payloads; containers, marks and the memo are the rest. When a
    payload ends in another 4 MiB block than it starts, ``release(start)`` is called.
    """
    defs, goffs, gkeys = w.defs, w.get_offs, w.get_keys
    stack: list[Value] = []
    push = stack.append
    nodepos: list[int] = []  # stack positions holding nodes
    marks: list[int] = []  # stack length at each MARK
    moffs: list[int] = []  # offset of each MARK
    memo: dict[int, Node] = {}  # memo key -> node stored there, while it is kept
    key0, first_id, carry, skipped, fence = len(defs), -1, -1, 0, 0
    step_of, form_of, action_of = PUSH_STEP, FORM, ACTION
    while True:
        if pos >= end:
            raise _cut(w, pos, "the opcode stream (no STOP)")
        op = buf[pos]
        step = step_of[op]
        if step:
            push(pos)
            pos += step
            continue
        if op == MEMOIZE_OP:
            if len(stack) <= fence:
                raise _bad(w, pos, op, "with nothing on the stack")
            if first_id:
                if first_id > 0:
                    raise _Refused("MEMOIZE after PUTs that did not start at id 0", pos)
                first_id = 0
            top = stack[-1]
            if type(top) is list:
                memo[len(defs)] = top
                top[KEY] = len(defs)
            defs.append(pos)
            pos += 1
            continue
        form = form_of[op]
        if F_LEN1 <= form <= F_LEN8U:  # every length-prefixed opcode pushes one value
            hdr = 2 if form == F_LEN1 else 9 if form == F_LEN8U else 5
            if pos + hdr > end:
                raise _cut(w, pos, f"the length of {OPNAME[op]}")
            if form == F_LEN1:
                n = buf[pos + 1]
            else:
                n = (I4 if form == F_LEN4S else U4 if form == F_LEN4U else U8)(buf, pos + 1)[0]
                if n < 0:
                    raise _bad(w, pos, op, f"declares a negative length {n}")
            if pos + hdr + n > end:
                raise _cut(w, pos, f"the {n}-byte payload of {OPNAME[op]} ({end - pos} bytes left)")
            skipped += n
            if release is not None and (pos + hdr + n) >> RELEASE_SHIFT != pos >> RELEASE_SHIFT:
                release(pos)
            push(pos)
            pos += hdr + n
            continue
        if form == F_FIXED:
            nxt = pos + 1 + ARGLEN[op]
        elif form in (F_LINE, F_LINE2):
            nl = buf.find(b"\n", pos + 1, end)
            if nl >= 0 and form == F_LINE2:
                nl = buf.find(b"\n", nl + 1, end)
            if nl < 0:
                raise _cut(w, pos, f"the text argument of {OPNAME[op]}")
            nxt = nl + 1
        else:
            raise CorruptPickleError(w.name, f"unknown opcode 0x{op:02x}", offset=pos)
        if nxt > end:
            raise _cut(w, pos, f"the argument of {OPNAME[op]}")
        act = action_of[op]
        if act == A_GET:
            mid = buf[pos + 1] if op == BINGET_OP else _memo_arg(buf, pos, nxt, op, w)
            k = mid - first_id + key0
            if first_id < 0 or not key0 <= k < len(defs):
                why = f"GET of memo id {mid}, never stored in this pickle (a Pickler reused?)"
                raise _Refused(why, pos)
            goffs.append(pos)
            gkeys.append(k)
            start = pos if carry < 0 else carry
            carry = -1
            target = memo.get(k)
            if target is None:
                push(start)
            else:  # the same list/tuple/dict again: share its items
                nodepos.append(len(stack))
                push([target[KIND], start, target[ITEMS], target[BOUNDS], target[SUB], -1])
        elif act == A_MARK:
            fence = len(stack)
            marks.append(fence)
            moffs.append(pos)
        elif A_APPEND <= act <= A_SETITEMS:  # APPEND, APPENDS, SETITEM, SETITEMS
            if act in (A_APPENDS, A_SETITEMS):
                if not marks:
                    raise _bad(w, pos, op, "without a MARK")
                m = marks.pop()
                moffs.pop()
                fence = marks[-1] if marks else 0
            else:
                m = len(stack) - (1 if act == A_APPEND else 2)
            if m < 1 or m <= fence:
                raise _bad(w, pos, op, "with no container below its items")
            target = stack[m - 1]
            want = LIST if act <= A_APPENDS else DICT
            if (
                type(target) is not list
                or target[KIND] != want
                or (want == DICT and (len(stack) - m) % 2)
            ):
                _discard(stack, m, nodepos, memo)  # a subclass built by REDUCE: items not tracked
            elif nodepos and nodepos[-1] >= m:
                _adopt(target, stack, m, pos, nodepos, memo)
            else:
                items = target[ITEMS]
                items += stack[m:]
                del stack[m:]
                target[BOUNDS] += (len(items), pos)
        elif A_EMPTY_LIST <= act <= A_EMPTY_TUPLE:
            nodepos.append(len(stack))
            kind = LIST if act == A_EMPTY_LIST else DICT if act == A_EMPTY_DICT else TUPLE
            push([kind, pos, [], [], None, -1])
        elif act in (A_TUPLEN, A_POPN):
            m = len(stack) - NPOP[op]
            if m < fence:
                raise _bad(w, pos, op, "underflows the stack")
            start = start_of(stack[m])
            if act == A_POPN:
                _discard(stack, m, nodepos, memo)
                push(start)
            else:
                sub = _claim(stack, m, 0, nodepos, memo) if nodepos and nodepos[-1] >= m else None
                node = [TUPLE, start, stack[m:], [len(stack) - m, pos], sub, -1]
                del stack[m:]
                nodepos.append(m)
                push(node)
        elif act == A_PUT:
            if len(stack) <= fence:
                raise _bad(w, pos, op, "with nothing on the stack")
            mid = buf[pos + 1] if op == BINPUT_OP else _memo_arg(buf, pos, nxt, op, w)
            k = len(defs)
            if first_id < 0:
                first_id = mid
            elif mid != first_id + k - key0:
                raise _Refused(f"memo id {mid} stored out of order", pos)
            top = stack[-1]
            if type(top) is list:
                memo[k] = top
                top[KEY] = k
            defs.append(pos)
        elif act in (A_TUPLE, A_LIST, A_DICT, A_MARKPOP):
            if not marks:
                raise _bad(w, pos, op, "without a MARK")
            m, moff = marks.pop(), moffs.pop()
            fence = marks[-1] if marks else 0
            if act == A_MARKPOP:  # e.g. FROZENSET, ADDITEMS, OBJ: an opaque value
                lo = m - NPOP[op]
                if lo < fence:
                    raise _bad(w, pos, op, "underflows the stack")
                start = start_of(stack[lo]) if lo < m else moff
                _discard(stack, lo, nodepos, memo)
                push(start)
            else:
                kind = TUPLE if act == A_TUPLE else LIST if act == A_LIST else DICT
                if kind == DICT and (len(stack) - m) % 2:
                    raise _bad(w, pos, op, "with an odd number of items")
                node = [kind, moff, [], [], None, -1]
                _adopt(node, stack, m, pos, nodepos, memo)
                nodepos.append(len(stack))
                push(node)
        elif act == A_PUSH:
            push(pos)
        elif act == A_FRAME:
            if pos + 9 + U8(buf, pos + 1)[0] > end:
                raise _cut(w, pos, f"a FRAME of {U8(buf, pos + 1)[0]} bytes")
        elif act == A_STOP:
            if len(stack) != 1 or marks:
                raise _Refused(f"{len(stack)} values and {len(marks)} marks at STOP", pos)
            w.skipped += skipped
            return stack[0], nxt, max(first_id, 0)
        elif act in (A_POP, A_POP_MARK):  # only a recursive tuple: POPs, then a GET
            if act == A_POP and len(stack) > fence:
                s = start_of(stack[-1])
                _discard(stack, len(stack) - 1, nodepos, memo)
            elif marks:
                m, s = marks.pop(), moffs.pop()
                fence = marks[-1] if marks else 0
                _discard(stack, m, nodepos, memo)
            else:
                raise _bad(w, pos, op, "on an empty stack")
            carry = s if carry < 0 else min(carry, s)
            if _next_action(buf, nxt, end) not in (A_POP, A_POP_MARK, A_GET):
                raise _Refused(f"{OPNAME[op]} not followed by a GET", pos)
        elif act == A_PROTO:
            if buf[pos + 1] > HIGHEST_PROTOCOL:
                raise _bad(w, pos, op, f"names unknown protocol {buf[pos + 1]}")
        elif act == A_REFUSE:
            raise _Refused(REFUSED[op], pos)
        pos = nxt


def _memo_arg(buf: Any, pos: int, nxt: int, op: int, w: Walked) -> int:
    if FORM[op] == F_FIXED:
        return int(buf[pos + 1]) if ARGLEN[op] == 1 else int(U4(buf, pos + 1)[0])
    try:
        return int(bytes(buf[pos + 1 : nxt - 1]))
    except ValueError:
        raise _bad(w, pos, op, "argument is not a number") from None


def _next_action(buf: Any, pos: int, end: int) -> int:
    while pos + 9 <= end and buf[pos] == FRAME_OP:
        pos += 9
    return ACTION[buf[pos]] if pos < end else A_BAD


ENGINES: Final = ("auto", "compiled", "python")
WalkRecord = Callable[[Any, int, int, Walked, Release | None], tuple[Value, int, int]]


@functools.cache
def compiled_walker() -> WalkRecord | None:
    """The compiled twin of :func:`_walk_record` (``pickleshard._cscan``), or None if not built."""
    try:
        from ._cscan import walk_record
    except ImportError:
        return None
    return walk_record


def resolve_engine(engine: str) -> str:
    """``"compiled"`` or ``"python"``: the walker that ``engine`` (one of :data:`ENGINES`) means.

    ``"auto"`` is the compiled walker when the extension is built, else the pure-Python one;
    ``"compiled"`` raises ``ImportError`` when the extension is not built.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    if engine == "python":
        return engine
    if compiled_walker() is None:
        if engine == "compiled":
            raise ImportError(
                "the compiled scanner pickleshard._cscan is not built (pip install -e . builds it)"
            )
        return "python"
    return "compiled"


def _walk_with(
    walk: WalkRecord, buf: Any, pos: int, end: int, w: Walked, release: Release | None
) -> tuple[Value, int, int]:
    n_defs, n_gets = len(w.defs), len(w.get_offs)
    try:
        return walk(buf, pos, end, w, release)
    except _Unsupported:  # the compiled walker leaves this pickle to the reference
        del w.defs[n_defs:], w.get_offs[n_gets:], w.get_keys[n_gets:]
        return _walk_record(buf, pos, end, w, release)


def _releaser(buf: Any) -> Release | None:
    """For an mmap: drop its pages before an offset from this process's page tables (they stay
    in the page cache). A walk never reads back, and the kernel maps 64 KiB around every page
    fault: without this, walking a file of big payloads maps a tenth of it or more."""
    if not isinstance(buf, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    if len(buf) <= KEEP_MAPPED:
        return None  # small: its pages stay mapped until the scan unmaps the file
    done = [0]

    def release(upto: int) -> None:
        upto -= upto % mmap.PAGESIZE
        if upto > done[0]:
            buf.madvise(mmap.MADV_DONTNEED, done[0], upto - done[0])
            done[0] = upto

    return release


def walk_opcodes(buf: Any, size: int, name: str, *, engine: str = "auto") -> Walked:
    """Walk every pickle of ``buf[:size]`` (bytes or mmap), one after another.

    ``engine`` picks the walker (:func:`resolve_engine`); both give equal results and raise the
    same exceptions at the same offsets, and ``Walked.engine`` says which one ran. Pages of an
    mmap ``buf`` the walk has passed are unmapped as it goes (:func:`_releaser`). Raises
    :class:`EmptyPickleError`, :class:`NotAPickleError`, :class:`TruncatedPickleError` or
    :class:`CorruptPickleError` for bad bytes in the first pickle, and
    :class:`NotSpanIndexableError` for anything readable only as a whole (including bytes after
    the first pickle that are not a complete protocol 2+ pickle).
    """
    if size == 0:
        raise EmptyPickleError(name, "file is empty; expected a pickle stream", offset=0)
    if size == 1 and buf[0] == PROTO_OP:
        raise TruncatedPickleError(name, "stream ends inside the PROTO opcode", offset=0)
    engine = resolve_engine(engine)
    walk = compiled_walker() if engine == "compiled" else _walk_record
    assert walk is not None
    w = Walked(name, size, 0, [], [], array("q"), array("q"), array("q"), 0, engine)
    release = _releaser(buf)
    pos = 0
    while pos < size:
        first = not w.records
        proto = buf[pos + 1] if buf[pos] == PROTO_OP and pos + 1 < size else -1
        if first and proto > HIGHEST_PROTOCOL:
            raise NotAPickleError(name, f"PROTO opcode names unknown protocol {proto}", offset=1)
        if not 2 <= proto <= HIGHEST_PROTOCOL or (not first and proto != w.protocol):
            why = "no PROTO 2+ opcode at byte 0: a protocol 0 or 1 pickle, or not a pickle"
            if not first:
                why = f"bytes after pickle #{len(w.records)} are not a protocol {w.protocol} pickle"
            raise NotSpanIndexableError(name, why, offset=pos)
        key0, collecting = len(w.defs), gc.isenabled()
        gc.disable()  # the walk makes no cycles; GC passes over its lists cost half its time
        try:
            root, nxt, first_id = _walk_with(walk, buf, pos + 2, size, w, release)
        except _Refused as exc:
            raise NotSpanIndexableError(name, exc.reason, offset=exc.offset) from None
        except CorruptPickleError as exc:
            if first:
                raise
            why = f"pickle #{len(w.records) + 1} is damaged: {exc}"
            raise NotSpanIndexableError(name, why, offset=pos) from None
        finally:
            if collecting:
                gc.enable()
        w.protocol = proto
        w.roots.append(root)
        w.records.append((pos, nxt, key0 - first_id))
        pos = nxt
    return w


def open_buffer(path: str | os.PathLike[str]) -> tuple[Any, int]:
    """Map ``path`` read-only; return ``(buffer, size)`` (an empty file gives ``(b"", 0)``)."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return b"", 0
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), size
    except OSError as exc:
        raise UnreadableFileError(where, f"cannot read: {exc.strerror or exc}") from None


def opcode_end(data: Any, pos: int) -> int:
    """The offset just after the opcode at ``pos`` of ``data`` (bytes, memoryview or mmap),
    its argument and payload included."""
    op = data[pos]
    form = FORM[op]
    if form == F_FIXED:
        return pos + 1 + int(ARGLEN[op])
    if form == F_LEN1:
        return pos + 2 + int(data[pos + 1])
    if form in (F_LEN4S, F_LEN4U):
        return pos + 5 + int(U4(data, pos + 1)[0])
    if form == F_LEN8U:
        return pos + 9 + int(U8(data, pos + 1)[0])
    lines = 2 if form == F_LINE2 else 1
    end = pos + 1
    for _ in range(lines):
        end = bytes(data[end:]).index(b"\n", 0) + end + 1
    return end


def fast_opcodes(obj: Any, protocol: int) -> list[memoryview]:
    """``obj`` pickled by the C pickler in fast mode (no memo opcodes), as the pieces of its
    opcodes without ``PROTO``, ``FRAME`` headers and ``STOP``: what another pickle stream can
    splice in as one value."""
    buf = io.BytesIO()
    c = pickle.Pickler(buf, protocol)
    c.fast = True
    c.dump(obj)
    data = buf.getbuffer()
    pieces = [data[2:]] if protocol < 4 else _unframed(data)
    pieces[-1] = pieces[-1][:-1]  # STOP
    return pieces


def _unframed(data: memoryview) -> list[memoryview]:
    """The opcodes of a protocol 4+ pickle after its PROTO: FRAME contents and the opcodes
    between frames (large payloads, a short last frame), without the FRAME headers."""
    pieces, pos, n = [], 2, len(data)
    while pos < n:
        if data[pos] == FRAME_OP:
            size = int(U8(data, pos + 1)[0])
            pieces.append(data[pos + 9 : pos + 9 + size])
            pos += 9 + size
            continue
        start = pos
        while pos < n and data[pos] != FRAME_OP:
            pos = opcode_end(data, pos)
        pieces.append(data[start:pos])
    return pieces
