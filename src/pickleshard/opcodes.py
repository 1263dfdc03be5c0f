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

import gc
import mmap
import os
import pickle
import pickletools
import struct
from array import array
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

__all__ = [
    "ACTION",
    "ARGLEN",
    "FORM",
    "NPOP",
    "OPNAME",
    "PAYLOAD",
    "REFUSED",
    "encode_get",
    "encode_put",
]

F_BAD, F_FIXED, F_LEN1, F_LEN4S, F_LEN4U, F_LEN8U, F_LINE, F_LINE2 = range(8)

(
    A_BAD,
    A_PUSH,
    A_POPN,
    A_MARKPOP,
    A_NOP,
    A_FRAME,
    A_PROTO,
    A_STOP,
    A_MARK,
    A_POP,
    A_POP_MARK,
    A_MEMOIZE,
    A_PUT,
    A_GET,
    A_EMPTY_LIST,
    A_EMPTY_DICT,
    A_EMPTY_TUPLE,
    A_TUPLEN,
    A_TUPLE,
    A_LIST,
    A_DICT,
    A_APPEND,
    A_APPENDS,
    A_SETITEM,
    A_SETITEMS,
    A_REFUSE,
) = range(26)

P_NONE, P_BYTES, P_BYTEARRAY, P_TEXT = range(4)

_FORM_BY_N: Final = {
    pickletools.UP_TO_NEWLINE: F_LINE,
    pickletools.TAKEN_FROM_ARGUMENT1: F_LEN1,
    pickletools.TAKEN_FROM_ARGUMENT4: F_LEN4S,
    pickletools.TAKEN_FROM_ARGUMENT4U: F_LEN4U,
    pickletools.TAKEN_FROM_ARGUMENT8U: F_LEN8U,
}
_PREFIX_LEN: Final = {F_LEN1: 1, F_LEN4S: 4, F_LEN4U: 4, F_LEN8U: 8}

_SPECIAL: Final = {
    "FRAME": A_FRAME,
    "PROTO": A_PROTO,
    "STOP": A_STOP,
    "MARK": A_MARK,
    "POP": A_POP,
    "POP_MARK": A_POP_MARK,
    "MEMOIZE": A_MEMOIZE,
    "PUT": A_PUT,
    "BINPUT": A_PUT,
    "LONG_BINPUT": A_PUT,
    "GET": A_GET,
    "BINGET": A_GET,
    "LONG_BINGET": A_GET,
    "EMPTY_LIST": A_EMPTY_LIST,
    "EMPTY_DICT": A_EMPTY_DICT,
    "EMPTY_TUPLE": A_EMPTY_TUPLE,
    "TUPLE1": A_TUPLEN,
    "TUPLE2": A_TUPLEN,
    "TUPLE3": A_TUPLEN,
    "TUPLE": A_TUPLE,
    "LIST": A_LIST,
    "DICT": A_DICT,
    "APPEND": A_APPEND,
    "APPENDS": A_APPENDS,
    "SETITEM": A_SETITEM,
    "SETITEMS": A_SETITEMS,
}
_REFUSE_WHY: Final = {
    "PERSID": "a persistent id (PERSID), resolved by the pickler's owner, not by the file",
    "BINPERSID": "a persistent id (BINPERSID), resolved by the pickler's owner, not by the file",
    "NEXT_BUFFER": "an out-of-band buffer (NEXT_BUFFER) whose bytes are not in the file",
    "READONLY_BUFFER": "an out-of-band buffer (READONLY_BUFFER) whose bytes are not in the file",
    "DUP": "a DUP opcode (one value in two places; CPython's pickler never writes it)",
}
_PAYLOAD_BY_ARG: Final = {
    "bytes1": P_BYTES,
    "bytes4": P_BYTES,
    "bytes8": P_BYTES,
    "bytearray8": P_BYTEARRAY,
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
    if _op.arg is None:
        FORM[_b], ARGLEN[_b] = F_FIXED, 0
    elif _op.arg.n >= 0:
        FORM[_b], ARGLEN[_b] = F_FIXED, _op.arg.n
    elif _op.arg.name == "stringnl_noescape_pair":
        FORM[_b] = F_LINE2
    else:
        FORM[_b] = _FORM_BY_N[_op.arg.n]
        ARGLEN[_b] = _PREFIX_LEN.get(FORM[_b], 0)
    if FORM[_b] in _PREFIX_LEN:
        PAYLOAD[_b] = _PAYLOAD_BY_ARG.get(_op.arg.name if _op.arg else "", P_TEXT)
    if _op.name in _REFUSE_WHY:
        ACTION[_b] = A_REFUSE
        REFUSED[_b] = _REFUSE_WHY[_op.name]
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
# each fixed-size opcode the span rewriter copies as is (not a memo opcode, not FRAME); else 0.
PUSH_STEP: list[int] = [1 + ARGLEN[b] if ACTION[b] == A_PUSH and FORM[b] == F_FIXED else 0 for b in range(256)]
COPY_STEP: list[int] = [
    1 + ARGLEN[b] if FORM[b] == F_FIXED and ACTION[b] not in (A_BAD, A_GET, A_PUT, A_FRAME) else 0 for b in range(256)
]
if any(ACTION[b] != A_PUSH for b in range(256) if FORM[b] in (F_LEN1, F_LEN4S, F_LEN4U, F_LEN8U)):
    raise AssertionError("the scanner assumes every length-prefixed opcode pushes one value")
STOP_OP: Final = ord(".")
FRAME_OP: Final = 0x95
MEMOIZE_OP: Final = 0x94
BINPUT_OP: Final = ord("q")
LONG_BINPUT_OP: Final = ord("r")
BINGET_OP: Final = ord("h")
LONG_BINGET_OP: Final = ord("j")
NEXT_BUFFER_OP: Final = 0x97
POP_OP: Final = ord("0")
BININT1_OP: Final = ord("K")
BININT_OP: Final = ord("J")
BINPERSID_OP: Final = ord("Q")
SHORT_BINUNICODE_OP: Final = 0x8C
BINUNICODE_OP: Final = ord("X")

U2: Final = struct.Struct("<H").unpack_from
U4: Final = struct.Struct("<I").unpack_from
I4: Final = struct.Struct("<i").unpack_from
U8: Final = struct.Struct("<Q").unpack_from
_P4: Final = struct.Struct("<I").pack


def encode_put(local_id: int) -> bytes:
    """``BINPUT`` or ``LONG_BINPUT`` storing the top of the stack at memo id ``local_id``."""
    if local_id < 256:
        return bytes((BINPUT_OP, local_id))
    return bytes((LONG_BINPUT_OP,)) + _P4(local_id)


def encode_get(local_id: int) -> bytes:
    """``BINGET`` or ``LONG_BINGET`` pushing memo id ``local_id``."""
    if local_id < 256:
        return bytes((BINGET_OP, local_id))
    return bytes((LONG_BINGET_OP,)) + _P4(local_id)


LIST, TUPLE, DICT = 1, 2, 3

# A node is a list, tuple or dict built on the scanner's stack, kept as a plain Python list
# (three times cheaper to make than an object) with these slots:
#   KIND    LIST, TUPLE or DICT
#   START   offset of the first opcode of the value
#   ITEMS   per item, its start offset (an int) or its own node
#   BOUNDS  flat [count, end, count, end...]: after each batch (APPENDS, SETITEMS, TUPLE...) the
#           item count and the offset of the consuming opcode, which ends the batch's last item
#   SUB     indices of the items that are still nodes, or None. When a node becomes an item of
#           another, its own node items are turned into their start offsets: only two levels
#           below any node on the stack are kept, which is all a layout needs.
#   KEY     the memo key stored from this node, or -1
KIND, START, ITEMS, BOUNDS, SUB, KEY = range(6)
Node = list  # type: ignore[type-arg]
Value = Any  # an int (start offset of an opaque value) or a Node


def _start(v: Value) -> int:
    return v if type(v) is int else v[START]  # type: ignore[no-any-return]


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


def _claim(stack: list[Value], m: int, base: int, nodepos: list[int], memo_nodes: dict[int, Node]) -> list[int]:
    """Nodes among ``stack[m:]`` become items (at ``base + j - m``) of another node: prune them."""
    sub = []
    while nodepos and nodepos[-1] >= m:
        j = nodepos.pop()
        _prune(stack[j], memo_nodes)
        sub.append(base + j - m)
    return sub


def _adopt(target: Node, stack: list[Value], m: int, end: int, nodepos: list[int], memo_nodes: dict[int, Node]) -> None:
    """Move ``stack[m:]`` into ``target``'s items; the last of them ends at ``end``."""
    items = target[ITEMS]
    if nodepos and nodepos[-1] >= m:
        if target[SUB] is None:
            target[SUB] = []
        target[SUB] += _claim(stack, m, len(items), nodepos, memo_nodes)
    items += stack[m:]
    del stack[m:]
    target[BOUNDS] += (len(items), end)


def _discard(stack: list[Value], m: int, nodepos: list[int], memo_nodes: dict[int, Node]) -> None:
    while nodepos and nodepos[-1] >= m:
        nd = stack[nodepos.pop()]
        if nd[KEY] >= 0:
            memo_nodes.pop(nd[KEY], None)
        _prune(nd, memo_nodes)
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


class _Refused(Exception):
    def __init__(self, reason: str, offset: int) -> None:
        self.reason, self.offset = reason, offset


def _trunc(name: str, pos: int, what: str) -> TruncatedPickleError:
    return TruncatedPickleError(name, f"stream ends inside {what}", offset=pos)


def _walk_record(buf: Any, pos: int, end: int, w: Walked) -> tuple[Value, int, int]:
    """Walk one pickle from just after its PROTO to its STOP; return (root, end, first id).

    The hot loop: one table lookup and one ``list.append`` for the common fixed-size pushes,
    a length read and a seek for payloads; containers, marks and the memo are the rest.
    """
    name = w.name
    defs, goffs, gkeys = w.defs, w.get_offs, w.get_keys
    stack: list[Value] = []
    push = stack.append
    nodepos: list[int] = []
    marks: list[int] = []
    moffs: list[int] = []
    memo_nodes: dict[int, Node] = {}
    key0, first_id, carry, skipped, fence = len(defs), -1, -1, 0, 0
    step_of, form_of, action_of = PUSH_STEP, FORM, ACTION
    while True:
        if pos >= end:
            raise _trunc(name, pos, "the opcode stream (no STOP)")
        op = buf[pos]
        step = step_of[op]
        if step:
            push(pos)
            pos += step
            continue
        if op == MEMOIZE_OP:
            if len(stack) <= fence:
                raise CorruptPickleError(name, "MEMOIZE with nothing on the stack", offset=pos)
            if first_id:
                if first_id > 0:
                    raise _Refused("MEMOIZE after PUTs that did not start at id 0", pos)
                first_id = 0
            top = stack[-1]
            if type(top) is list:
                memo_nodes[len(defs)] = top
                top[KEY] = len(defs)
            defs.append(pos)
            pos += 1
            continue
        form = form_of[op]
        if form == F_LEN1 and pos + 2 <= end:
            n = buf[pos + 1]
            if pos + 2 + n > end:
                raise _trunc(name, pos, f"the {n}-byte payload of {OPNAME[op]}")
            skipped += n
            push(pos)
            pos += 2 + n
            continue
        if F_LEN1 <= form <= F_LEN8U:  # every length-prefixed opcode pushes one value
            hdr = 2 if form == F_LEN1 else 9 if form == F_LEN8U else 5
            if pos + hdr > end:
                raise _trunc(name, pos, f"the length of {OPNAME[op]}")
            n = buf[pos + 1] if form == F_LEN1 else (I4 if form == F_LEN4S else U4 if form == F_LEN4U else U8)(buf, pos + 1)[0]
            if n < 0:
                raise CorruptPickleError(name, f"{OPNAME[op]} declares a negative length {n}", offset=pos)
            if pos + hdr + n > end:
                raise _trunc(name, pos, f"the {n}-byte payload of {OPNAME[op]} ({end - pos - hdr} bytes left)")
            skipped += n
            push(pos)
            pos += hdr + n
            continue
        if form == F_FIXED:
            nxt = pos + 1 + ARGLEN[op]
        elif form == F_LINE or form == F_LINE2:
            nl = buf.find(b"\n", pos + 1, end)
            if nl >= 0 and form == F_LINE2:
                nl = buf.find(b"\n", nl + 1, end)
            if nl < 0:
                raise _trunc(name, pos, f"the text argument of {OPNAME[op]}")
            nxt = nl + 1
        else:
            raise CorruptPickleError(name, f"unknown opcode 0x{op:02x}", offset=pos)
        if nxt > end:
            raise _trunc(name, pos, f"the argument of {OPNAME[op]}")
        act = action_of[op]
        if act == A_GET:
            mid = buf[pos + 1] if op == BINGET_OP else _memo_arg(buf, pos, nxt, op, name)
            k = mid - first_id + key0
            if first_id < 0 or not key0 <= k < len(defs):
                raise _Refused(f"GET of memo id {mid}, which this pickle never stored (a Pickler reused across dumps?)", pos)
            goffs.append(pos)
            gkeys.append(k)
            start = pos if carry < 0 else carry
            carry = -1
            target = memo_nodes.get(k)
            if target is None:
                push(start)
            else:  # the same list/tuple/dict again: share its items
                nodepos.append(len(stack))
                push([target[KIND], start, target[ITEMS], target[BOUNDS], target[SUB], -1])
        elif act == A_MARK:
            fence = len(stack)
            marks.append(fence)
            moffs.append(pos)
        elif act == A_APPENDS or act == A_SETITEMS or act == A_APPEND or act == A_SETITEM:
            if act == A_APPENDS or act == A_SETITEMS:
                if not marks:
                    raise CorruptPickleError(name, f"{OPNAME[op]} without a MARK", offset=pos)
                m = marks.pop()
                fence = marks[-1] if marks else 0
                moffs.pop()
            else:
                m = len(stack) - (1 if act == A_APPEND else 2)
            if m < 1 or (marks and m <= marks[-1]):
                raise CorruptPickleError(name, f"{OPNAME[op]} with no container below its items", offset=pos)
            target = stack[m - 1]
            want = LIST if act == A_APPENDS or act == A_APPEND else DICT
            if type(target) is list and target[KIND] == want and (want == LIST or (len(stack) - m) % 2 == 0):
                if nodepos and nodepos[-1] >= m:
                    _adopt(target, stack, m, pos, nodepos, memo_nodes)
                else:
                    items = target[ITEMS]
                    items += stack[m:]
                    del stack[m:]
                    target[BOUNDS] += (len(items), pos)
            else:  # a list or dict subclass built by REDUCE/NEWOBJ: its items are not tracked
                _discard(stack, m, nodepos, memo_nodes)
        elif act == A_EMPTY_LIST or act == A_EMPTY_DICT or act == A_EMPTY_TUPLE:
            nodepos.append(len(stack))
            push([LIST if act == A_EMPTY_LIST else DICT if act == A_EMPTY_DICT else TUPLE, pos, [], [], None, -1])
        elif act == A_TUPLEN or act == A_POPN:
            m = len(stack) - NPOP[op]
            if m < fence:
                raise CorruptPickleError(name, f"stack underflow at {OPNAME[op]}", offset=pos)
            start = _start(stack[m])
            if act == A_TUPLEN:
                sub = _claim(stack, m, 0, nodepos, memo_nodes) if nodepos and nodepos[-1] >= m else None
                node = [TUPLE, start, stack[m:], [len(stack) - m, pos], sub, -1]
                del stack[m:]
                nodepos.append(m)
                push(node)
            else:
                _discard(stack, m, nodepos, memo_nodes)
                push(start)
        elif act == A_PUT:
            if len(stack) <= fence:
                raise CorruptPickleError(name, f"{OPNAME[op]} with nothing on the stack", offset=pos)
            mid = buf[pos + 1] if op == BINPUT_OP else _memo_arg(buf, pos, nxt, op, name)
            k = len(defs)
            if first_id < 0:
                first_id = mid
            elif mid != first_id + k - key0:
                raise _Refused(f"memo id {mid} stored out of order (expected {first_id + k - key0})", pos)
            top = stack[-1]
            if type(top) is list:
                memo_nodes[k] = top
                top[KEY] = k
            defs.append(pos)
        elif act == A_TUPLE or act == A_LIST or act == A_DICT or act == A_MARKPOP:
            if not marks:
                raise CorruptPickleError(name, f"{OPNAME[op]} without a MARK", offset=pos)
            m, moff = marks.pop(), moffs.pop()
            fence = marks[-1] if marks else 0
            if act == A_MARKPOP:
                lo = m - NPOP[op]
                if lo < fence:
                    raise CorruptPickleError(name, f"stack underflow at {OPNAME[op]}", offset=pos)
                start = _start(stack[lo]) if lo < m else moff
                _discard(stack, lo, nodepos, memo_nodes)
                push(start)
            else:
                kind = TUPLE if act == A_TUPLE else LIST if act == A_LIST else DICT
                if kind == DICT and (len(stack) - m) % 2:
                    raise CorruptPickleError(name, "DICT with an odd number of items", offset=pos)
                node = [kind, moff, [], [], None, -1]
                _adopt(node, stack, m, pos, nodepos, memo_nodes)
                nodepos.append(len(stack))
                push(node)
        elif act == A_PUSH:
            push(pos)
        elif act == A_FRAME:
            if pos + 9 + U8(buf, pos + 1)[0] > end:
                raise _trunc(name, pos, f"a FRAME of {U8(buf, pos + 1)[0]} bytes")
        elif act == A_STOP:
            if len(stack) != 1 or marks:
                raise _Refused(f"{len(stack)} values and {len(marks)} marks on the stack at STOP", pos)
            w.skipped += skipped
            return stack[0], nxt, max(first_id, 0)
        elif act == A_POP or act == A_POP_MARK:
            if act == A_POP and len(stack) > fence:
                s = _start(stack[-1])
                _discard(stack, len(stack) - 1, nodepos, memo_nodes)
            elif marks:
                m, s = marks.pop(), moffs.pop()
                fence = marks[-1] if marks else 0
                _discard(stack, m, nodepos, memo_nodes)
            else:
                raise CorruptPickleError(name, f"{OPNAME[op]} on an empty stack", offset=pos)
            carry = s if carry < 0 else min(carry, s)
            if _next_op(buf, nxt, end) not in (A_POP, A_POP_MARK, A_GET):
                raise _Refused(f"{OPNAME[op]} not followed by a GET (only a recursive tuple does that)", pos)
        elif act == A_PROTO:
            if buf[pos + 1] > HIGHEST_PROTOCOL:
                raise CorruptPickleError(name, f"PROTO {buf[pos + 1]} is not a known protocol", offset=pos)
        elif act == A_REFUSE:
            raise _Refused(REFUSED[op], pos)
        pos = nxt


def _memo_arg(buf: Any, pos: int, nxt: int, op: int, name: str) -> int:
    if FORM[op] == F_FIXED:
        return int(buf[pos + 1]) if ARGLEN[op] == 1 else int(U4(buf, pos + 1)[0])
    try:
        return int(bytes(buf[pos + 1 : nxt - 1]))
    except ValueError:
        raise CorruptPickleError(
            name, f"{OPNAME[op]} argument is not a number", offset=pos
        ) from None


def _next_op(buf: Any, pos: int, end: int) -> int:
    while pos + 9 <= end and buf[pos] == FRAME_OP:
        pos += 9
    return ACTION[buf[pos]] if pos < end else A_BAD


def walk_opcodes(buf: Any, size: int, name: str) -> Walked:
    """Walk every pickle record of ``buf[:size]`` (bytes or mmap) and return what they hold.

    Raises :class:`EmptyPickleError`, :class:`NotAPickleError`, :class:`TruncatedPickleError`
    or :class:`CorruptPickleError` for bad bytes in the first record, and
    :class:`NotSpanIndexableError` for anything readable only as a whole (including bytes after
    the first record that are not a complete protocol 2+ pickle).
    """
    if size == 0:
        raise EmptyPickleError(name, "file is empty; expected a pickle stream", offset=0)
    w = Walked(name, size, 0, [], [], array("q"), array("q"), array("q"), 0)
    pos = 0
    while pos < size:
        first = not w.records
        if first and size == 1 and buf[0] == PROTO_OP:
            raise TruncatedPickleError(name, "stream ends inside the PROTO opcode", offset=0)
        if buf[pos] != PROTO_OP or pos + 2 > size or not 2 <= buf[pos + 1] <= HIGHEST_PROTOCOL:
            proto = buf[pos + 1] if buf[pos] == PROTO_OP and pos + 2 <= size else None
            if first and proto is not None and proto > HIGHEST_PROTOCOL:
                raise NotAPickleError(
                    name, f"PROTO opcode names unknown protocol {proto}", offset=1
                )
            why = "no PROTO 2+ opcode at byte 0: a protocol 0 or 1 pickle, or not a pickle at all"
            if not first:
                why = f"{size - pos} bytes after the end of pickle #{len(w.records)} do not start a protocol 2+ pickle"
            raise NotSpanIndexableError(name, why, offset=pos)
        proto = buf[pos + 1]
        if not first and proto != w.protocol:
            raise NotSpanIndexableError(
                name, f"appended pickles use protocols {w.protocol} and {proto}", offset=pos
            )
        key0 = len(w.defs)
        collecting = gc.isenabled()
        gc.disable()  # the walk builds no cycles; collecting its many young lists costs half its time
        try:
            root, nxt, first_id = _walk_record(buf, pos + 2, size, w)
        except _Refused as exc:
            raise NotSpanIndexableError(name, exc.reason, offset=exc.offset) from None
        except CorruptPickleError as exc:
            if first:
                raise
            raise NotSpanIndexableError(
                name, f"pickle #{len(w.records) + 1} is damaged: {exc}", offset=pos
            ) from None
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
