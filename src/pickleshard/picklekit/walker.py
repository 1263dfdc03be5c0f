"""The opcode walker: one pickle's values, containers and memo, stepped with :func:`extent`.

:func:`walk_record` is the pure-Python reference; ``pickleshard._cscan.walk_record`` is its
compiled twin (same arguments, results and errors), chosen by
:func:`pickleshard.picklekit.walk.walk_opcodes`. Both step over every opcode and payload with the
one primitive (:func:`pickleshard.picklekit.extent.extent` and its inline C twin), so every
length is checked against the bytes left the same way.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import CorruptPickleError, TruncatedPickleError
from .extent import CUT, extent, extent_error
from .nodes import (
    BOUNDS,
    DICT,
    ITEMS,
    KEY,
    KIND,
    LIST,
    SUB,
    TUPLE,
    Node,
    Value,
    adopt,
    claim,
    discard,
    start_of,
)
from .opcodes import (
    A_APPEND,
    A_APPENDS,
    A_BAD,
    A_DICT,
    A_EMPTY_DICT,
    A_EMPTY_LIST,
    A_EMPTY_TUPLE,
    A_FRAME,
    A_GET,
    A_LIST,
    A_MARK,
    A_MARKPOP,
    A_POP,
    A_POP_MARK,
    A_POPN,
    A_PROTO,
    A_PUSH,
    A_PUT,
    A_REFUSE,
    A_SETITEMS,
    A_STOP,
    A_TUPLE,
    A_TUPLEN,
    ACTION,
    ARGLEN,
    BINGET_OP,
    BINPUT_OP,
    F_FIXED,
    F_LEN8U,
    FINDS_CLASS,
    FORM,
    FRAME_OP,
    HEAD,
    HIGHEST_PROTOCOL,
    MEMOIZE_OP,
    NAME_TEXT,
    NPOP,
    OPNAME,
    PUSH_STEP,
    REFUSED,
    STACK_GLOBAL_OP,
    U4,
    U8,
)

__all__ = ["RELEASE_SHIFT", "Refused", "Release", "Unsupported", "Walked", "walk_record"]

RELEASE_SHIFT: Final = 22  # walks release mapped pages every 4 MiB (see walk.releaser)
Release = Callable[[int], None]


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
    # opcodes that name a global (GLOBAL, STACK_GLOBAL, INST, EXT1/2/4; FINDS_CLASS): none
    # means the globals audit has nothing to find, and need not walk the file again
    global_ops: int = 0
    # the globals audit's facts (safety.audit.named): per global-naming opcode walked (not
    # replayed: a replay repeats the bytes and memo keys of a value walked before),
    # ``(offset, a, b)``, a and b the offsets of a STACK_GLOBAL's operands (-1: not a
    # scalar); and the memo keys that store a string opcode's value, with its offset
    named: array[int] = field(default_factory=lambda: array("q"))
    strs: dict[int, int] = field(default_factory=dict)


class Refused(Exception):
    """What makes a pickle readable only as a whole: ``reason`` at ``offset``."""

    def __init__(self, reason: str, offset: int) -> None:
        self.reason, self.offset = reason, offset


class Unsupported(Exception):
    """Raised by the compiled walker for what it leaves to this one (a huge text memo id)."""


def cut_error(w: Walked, pos: int, what: str) -> TruncatedPickleError:
    return TruncatedPickleError(w.name, f"stream ends inside {what}", offset=pos)


def bad_error(w: Walked, pos: int, op: int, what: str) -> CorruptPickleError:
    return CorruptPickleError(w.name, f"{OPNAME[op]} {what}", offset=pos)


def walk_record(
    buf: Any, pos: int, end: int, w: Walked, release: Release | None = None
) -> tuple[Value, int, int]:
    """Walk one pickle from just after its PROTO to its STOP; return (root, end, first id).

    The hot loop: one table lookup and one ``list.append`` for the common fixed-size pushes;
    every other opcode is stepped over by :func:`extent` (payloads seeked over, their length
    checked against the bytes left); containers, marks and the memo are the rest. When a
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
    step_of, form_of, action_of, head_of = PUSH_STEP, FORM, ACTION, HEAD
    finds_class, name_text = FINDS_CLASS, NAME_TEXT
    while True:
        if pos >= end:
            raise cut_error(w, pos, "the opcode stream (no STOP)")
        op = buf[pos]
        step = step_of[op]
        if step:
            push(pos)
            pos += step
            continue
        if op == MEMOIZE_OP:
            if len(stack) <= fence:
                raise bad_error(w, pos, op, "with nothing on the stack")
            if first_id:
                if first_id > 0:
                    raise Refused("MEMOIZE after PUTs that did not start at id 0", pos)
                first_id = 0
            top = stack[-1]
            if type(top) is list:
                memo[len(defs)] = top
                top[KEY] = len(defs)
            elif name_text[buf[top]]:
                w.strs[len(defs)] = top
            defs.append(pos)
            pos += 1
            continue
        form = form_of[op]
        if form == F_FIXED:  # extent's first case, inline: a call costs more than the step
            nxt = pos + head_of[op]
            if nxt > end:
                raise extent_error(CUT, buf, pos, end, w.name)
        else:
            nxt = extent(buf, pos, end)
            if nxt < 0:
                raise extent_error(nxt, buf, pos, end, w.name)
            if form <= F_LEN8U:  # every length-prefixed opcode pushes one value
                skipped += nxt - pos - head_of[op]
                if release is not None and nxt >> RELEASE_SHIFT != pos >> RELEASE_SHIFT:
                    release(pos)
                push(pos)
                pos = nxt
                continue
        act = action_of[op]
        if finds_class[op]:
            w.global_ops += 1
            a = b = -1
            if op == STACK_GLOBAL_OP and len(stack) >= 2:
                a = stack[-2] if type(stack[-2]) is int else -1
                b = stack[-1] if type(stack[-1]) is int else -1
            w.named.extend((pos, a, b))
        if act == A_GET:
            mid = buf[pos + 1] if op == BINGET_OP else memo_arg(buf, pos, nxt, op, w)
            k = mid - first_id + key0
            if first_id < 0 or not key0 <= k < len(defs):
                why = f"GET of memo id {mid}, never stored in this pickle (a Pickler reused?)"
                raise Refused(why, pos)
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
                    raise bad_error(w, pos, op, "without a MARK")
                m = marks.pop()
                moffs.pop()
                fence = marks[-1] if marks else 0
            else:
                m = len(stack) - (1 if act == A_APPEND else 2)
            if m < 1 or m <= fence:
                raise bad_error(w, pos, op, "with no container below its items")
            target = stack[m - 1]
            want = LIST if act <= A_APPENDS else DICT
            if (
                type(target) is not list
                or target[KIND] != want
                or (want == DICT and (len(stack) - m) % 2)
            ):
                discard(stack, m, nodepos, memo)  # a subclass built by REDUCE: items not tracked
            elif nodepos and nodepos[-1] >= m:
                adopt(target, stack, m, pos, nodepos, memo)
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
                raise bad_error(w, pos, op, "underflows the stack")
            start = start_of(stack[m])
            if act == A_POPN:
                discard(stack, m, nodepos, memo)
                push(start)
            else:
                sub = claim(stack, m, 0, nodepos, memo) if nodepos and nodepos[-1] >= m else None
                node = [TUPLE, start, stack[m:], [len(stack) - m, pos], sub, -1]
                del stack[m:]
                nodepos.append(m)
                push(node)
        elif act == A_PUT:
            if len(stack) <= fence:
                raise bad_error(w, pos, op, "with nothing on the stack")
            mid = buf[pos + 1] if op == BINPUT_OP else memo_arg(buf, pos, nxt, op, w)
            k = len(defs)
            if first_id < 0:
                first_id = mid
            elif mid != first_id + k - key0:
                raise Refused(f"memo id {mid} stored out of order", pos)
            top = stack[-1]
            if type(top) is list:
                memo[k] = top
                top[KEY] = k
            elif name_text[buf[top]]:
                w.strs[k] = top
            defs.append(pos)
        elif act in (A_TUPLE, A_LIST, A_DICT, A_MARKPOP):
            if not marks:
                raise bad_error(w, pos, op, "without a MARK")
            m, moff = marks.pop(), moffs.pop()
            fence = marks[-1] if marks else 0
            if act == A_MARKPOP:  # e.g. FROZENSET, ADDITEMS, OBJ: an opaque value
                lo = m - NPOP[op]
                if lo < fence:
                    raise bad_error(w, pos, op, "underflows the stack")
                start = start_of(stack[lo]) if lo < m else moff
                discard(stack, lo, nodepos, memo)
                push(start)
            else:
                kind = TUPLE if act == A_TUPLE else LIST if act == A_LIST else DICT
                if kind == DICT and (len(stack) - m) % 2:
                    raise bad_error(w, pos, op, "with an odd number of items")
                node = [kind, moff, [], [], None, -1]
                adopt(node, stack, m, pos, nodepos, memo)
                nodepos.append(len(stack))
                push(node)
        elif act == A_PUSH:
            push(pos)
        elif act == A_FRAME:
            if pos + 9 + U8(buf, pos + 1)[0] > end:
                raise cut_error(w, pos, f"a FRAME of {U8(buf, pos + 1)[0]} bytes")
        elif act == A_STOP:
            if len(stack) != 1 or marks:
                raise Refused(f"{len(stack)} values and {len(marks)} marks at STOP", pos)
            w.skipped += skipped
            return stack[0], nxt, max(first_id, 0)
        elif act in (A_POP, A_POP_MARK):  # only a recursive tuple: POPs, then a GET
            if act == A_POP and len(stack) > fence:
                s = start_of(stack[-1])
                discard(stack, len(stack) - 1, nodepos, memo)
            elif marks:
                m, s = marks.pop(), moffs.pop()
                fence = marks[-1] if marks else 0
                discard(stack, m, nodepos, memo)
            else:
                raise bad_error(w, pos, op, "on an empty stack")
            carry = s if carry < 0 else min(carry, s)
            if next_action(buf, nxt, end) not in (A_POP, A_POP_MARK, A_GET):
                raise Refused(f"{OPNAME[op]} not followed by a GET", pos)
        elif act == A_PROTO:
            if buf[pos + 1] > HIGHEST_PROTOCOL:
                raise bad_error(w, pos, op, f"names unknown protocol {buf[pos + 1]}")
        elif act == A_REFUSE:
            raise Refused(REFUSED[op], pos)
        pos = nxt


def memo_arg(buf: Any, pos: int, nxt: int, op: int, w: Walked) -> int:
    if FORM[op] == F_FIXED:
        return int(buf[pos + 1]) if ARGLEN[op] == 1 else int(U4(buf, pos + 1)[0])
    try:
        return int(bytes(buf[pos + 1 : nxt - 1]))
    except ValueError:
        raise bad_error(w, pos, op, "argument is not a number") from None


def next_action(buf: Any, pos: int, end: int) -> int:
    while pos + 9 <= end and buf[pos] == FRAME_OP:
        pos += 9
    return ACTION[buf[pos]] if pos < end else A_BAD
