"""The audit's walk of one pickle: a symbolic stack of short strings and global references.

:func:`walk_record` steps over every opcode with :func:`~pickleshard.picklekit.extent.extent`
(payloads seeked over, every length checked against the bytes left) and records, in the
:class:`~pickleshard.safety.audit.files.Audit` it is given, each global named and each call made on
one. Nothing is imported or called; see :mod:`pickleshard.safety.audit.files`.
"""

from __future__ import annotations

import codecs
import copyreg
import pickle
import pickletools
from collections.abc import Callable
from typing import Any

from ...errors import CorruptPickleError, TruncatedPickleError
from ...picklekit import opcodes as oc
from ...picklekit.extent import CUT, extent, extent_error
from .model import UNRESOLVED, Audit, GlobalKey

__all__ = ["COUNTED", "UNRESOLVED", "GlobalKey", "NestedAudit", "Walk", "walk_record"]


_OP = {name: getattr(pickle, name)[0] for name in ("GLOBAL", "INST", "STACK_GLOBAL", "REDUCE")}
_OP |= {name: getattr(pickle, name)[0] for name in ("NEWOBJ", "NEWOBJ_EX", "OBJ", "BUILD")}
_OP |= {name: getattr(pickle, name)[0] for name in ("EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID")}
_OP |= {name: getattr(pickle, name)[0] for name in ("DUP", "NEXT_BUFFER", "READONLY_BUFFER")}
_OP |= {name: getattr(pickle, name)[0] for name in ("STRING", "UNICODE", "PROTO")}
# Opcodes whose counts the report shows: what a file asks the unpickler to run or fetch.
COUNTED: tuple[str, ...] = ("REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ")
COUNTED += ("EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID", "NEXT_BUFFER", "READONLY_BUFFER")
_COUNTED_OPS = frozenset(_OP[n] for n in COUNTED)
# Length-prefixed strings short enough to be a module or name: decoded; longer ones are skipped.
_NAME_MAX = 256
_UNICODE_OPS = frozenset(getattr(pickle, n)[0] for n in ("SHORT_BINUNICODE", "BINUNICODE"))
_UNICODE_OPS |= {pickle.BINUNICODE8[0]}
_BYTESTR_OPS = frozenset(getattr(pickle, n)[0] for n in ("SHORT_BINSTRING", "BINSTRING"))
_NAME_OPS = _UNICODE_OPS | _BYTESTR_OPS
_OPPROTO = [0] * 256
for _op in pickletools.opcodes:
    _OPPROTO[ord(_op.code.encode("latin-1"))] = _op.proto
# Fixed-size pushes the audit treats like the scanner does, except the EXT lookups it names.
_FAST_STEP = list(oc.PUSH_STEP)
for _b in (_OP["EXT1"], _OP["EXT2"], _OP["EXT4"]):
    _FAST_STEP[_b] = 0


class Blob:
    """A ``bytes`` payload on the symbolic stack: where it is, for a nested torch payload; or,
    for ``_codecs.encode(text, "latin1")`` (how protocols 0-2 write bytes), its ``data``."""

    __slots__ = ("data", "n", "start")

    def __init__(self, start: int, n: int, data: bytes | None = None) -> None:
        self.start, self.n, self.data = start, n, data


class Text:
    """A long text payload on the symbolic stack (``BINUNICODE``...): an operand of
    ``_codecs.encode``, which protocols 0-2 use to write ``bytes``."""

    __slots__ = ("n", "start")

    def __init__(self, start: int, n: int) -> None:
        self.start, self.n = start, n


class EncodeArgs:
    """``(text, encoding)`` on the symbolic stack: the arguments of a ``_codecs.encode``."""

    __slots__ = ("encoding", "text")

    def __init__(self, text: Text, encoding: str | None) -> None:
        self.text, self.encoding = text, encoding


_TORCH_PAYLOAD: GlobalKey = ("torch.storage", "_load_from_bytes")
_ENCODE: GlobalKey = ("_codecs", "encode")
_PAYLOAD_MAX = 256 << 20  # text decoded for a nested payload: at most this many characters
#: ``nested(walk, offset, payload)``: the audit of a torch payload's pickles (:mod:`.torchpayloads`)
NestedAudit = Callable[["Walk", int, "Blob"], None]
_BYTES_OPS = frozenset(getattr(pickle, n)[0] for n in ("SHORT_BINBYTES", "BINBYTES", "BINBYTES8"))


class Walk:
    """State of one record's walk: the symbolic stack, marks and memo."""

    def __init__(self, audit: Audit, buf: Any, end: int, nested: NestedAudit | None = None) -> None:
        self.a, self.buf, self.end = audit, buf, end
        self.nested = nested  # audits a torch payload's pickles (None: not looked into)
        self.stack: list[Any] = []  # None (unknown), a string (see text), or a GlobalKey
        self.marks: list[int] = []
        self.values: dict[int, Any] = {}  # memo id -> string or GlobalKey (unknowns not kept)
        self.dense = 0  # memo ids 0..dense-1 are all defined
        self.sparse: set[int] = set()  # defined ids above dense
        self.proto = -1
        self.hi = 0  # highest protocol among the opcodes (for a record without PROTO)

    def fail(self, pos: int, what: str) -> CorruptPickleError:
        return CorruptPickleError(self.a.path, f"{oc.OPNAME[self.buf[pos]]} {what}", offset=pos)

    def cut(self, pos: int, what: str) -> TruncatedPickleError:
        return TruncatedPickleError(self.a.path, f"stream ends inside {what}", offset=pos)

    def need(self, pos: int, n: int) -> None:
        fence = self.marks[-1] if self.marks else 0
        if len(self.stack) - n < fence:
            raise self.fail(pos, "underflows the stack")

    def pop_mark(self, pos: int) -> int:
        if not self.marks:
            raise self.fail(pos, "without a MARK")
        return self.marks.pop()

    def define(self, mid: int, pos: int) -> None:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise self.fail(pos, "with nothing on the stack")
        top = self.stack[-1]
        if top is None:
            self.values.pop(mid, None)
        else:
            self.values[mid] = top
        if mid == self.dense:
            self.dense += 1
            while self.dense in self.sparse:
                self.sparse.remove(self.dense)
                self.dense += 1
        elif mid > self.dense:
            self.sparse.add(mid)

    def get(self, mid: int, pos: int) -> None:
        if not (0 <= mid < self.dense or mid in self.sparse):
            raise self.fail(pos, f"of memo id {mid}, which was never stored")
        self.stack.append(self.values.get(mid))

    def text(self, v: Any) -> str | None:
        """The string a stack value stands for: a decoded ``str``, or the offset (``int``) of a
        short string opcode, decoded now; None for anything else."""
        if type(v) is str:
            return v
        if type(v) is not int:
            return None
        buf, op = self.buf, self.buf[v]  # stepped over once already: its extent is sound
        raw = bytes(buf[v + oc.HEAD[op] : extent(buf, v, self.end)])
        return raw.decode("utf-8" if op in _UNICODE_OPS else "latin-1", "replace")

    def name(self, key: GlobalKey, pos: int = -1) -> GlobalKey:
        refs = self.a.refs
        refs[key] = refs.get(key, 0) + 1
        if key not in self.a.first_refs:
            self.a.first_refs[key] = pos
        return key

    def call(self, target: Any, pos: int = -1) -> None:
        if type(target) is tuple:
            self.a.calls[target] = self.a.calls.get(target, 0) + 1
            self.a.first_calls.setdefault(target, pos)
        else:
            self.a.computed_calls += 1

    def lines(self, pos: int, nxt: int) -> list[bytes]:
        """The text lines of the opcode ``buf[pos:nxt]`` (its :func:`extent`), newlines cut."""
        return bytes(self.buf[pos + 1 : nxt - 1]).split(b"\n")


def _memo_id(text: bytes, w: Walk, pos: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise w.fail(pos, "argument is not a number") from None


def _text_op(w: Walk, op: int, pos: int, nxt: int) -> None:
    """A text-argument opcode (protocol 0 style) at ``pos``, ending at ``nxt``."""
    act = oc.ACTION[op]
    if op in (_OP["GLOBAL"], _OP["INST"]):
        module, name = w.lines(pos, nxt)
        key = w.name((module.decode("utf-8", "replace"), name.decode("utf-8", "replace")), pos)
        if op == _OP["GLOBAL"]:
            w.stack.append(key)
        else:  # INST: instantiate the class with the items above the mark
            w.call(key, pos)
            del w.stack[w.pop_mark(pos) :]
            w.stack.append(None)
        return
    (text,) = w.lines(pos, nxt)
    if act == oc.A_PUT:
        w.define(_memo_id(text, w, pos), pos)
    elif act == oc.A_GET:
        w.get(_memo_id(text, w, pos), pos)
    elif op == _OP["STRING"]:
        w.stack.append(_quoted(text))
    elif op == _OP["UNICODE"]:
        w.stack.append(_unicode(text))
    else:  # INT, LONG, FLOAT, PERSID: values no global can be made of
        w.stack.append(None)


def _quoted(text: bytes) -> str | None:
    """STRING's argument, a quoted Python 2 ``str`` literal, as the name it may spell."""
    if len(text) < 2 or text[:1] not in (b"'", b'"') or text[-1:] != text[:1]:
        return None
    try:
        return codecs.escape_decode(text[1:-1])[0].decode("latin-1")
    except (ValueError, UnicodeError):
        return None


def _unicode(text: bytes) -> str | None:
    try:
        return str(text, "raw-unicode-escape")
    except UnicodeError:
        return None


def _fixed_op(w: Walk, op: int, pos: int, nxt: int) -> bool:
    """A fixed-size opcode; returns True at STOP."""
    stack, act = w.stack, oc.ACTION[op]
    if act == oc.A_POPN or act == oc.A_TUPLEN:
        n = oc.NPOP[op]
        w.need(pos, n)
        value: Any = None
        if op == _OP["STACK_GLOBAL"]:
            module, name = w.text(stack[-2]), w.text(stack[-1])
            resolved = (module, name) if module is not None and name is not None else None
            value = w.name(resolved or UNRESOLVED, pos)
        elif op == _OP["BUILD"]:
            value = stack[-2]  # BUILD leaves its target on the stack
            if type(value) is tuple:
                w.a.builds_on_globals.append((pos, value))
        elif op in (_OP["REDUCE"], _OP["NEWOBJ"]):
            w.call(stack[-2], pos)
            if stack[-2] == _TORCH_PAYLOAD and type(stack[-1]) is Blob and w.nested is not None:
                w.nested(w, pos, stack[-1])
            elif stack[-2] == _ENCODE and type(stack[-1]) is EncodeArgs:
                value = _encoded(w, stack[-1])  # bytes as protocols 0-2 write them
        elif op == _OP["NEWOBJ_EX"]:
            w.call(stack[-3], pos)
        del stack[len(stack) - n :]
        stack.append(value)
    elif act == oc.A_MARKPOP or oc.A_TUPLE <= act <= oc.A_DICT:
        m = w.pop_mark(pos)
        if m - oc.NPOP[op] < (w.marks[-1] if w.marks else 0):
            raise w.fail(pos, "underflows the stack")
        if op == _OP["OBJ"]:
            if len(stack) <= m:
                raise w.fail(pos, "with no class above its MARK")
            w.call(stack[m], pos)
        del stack[m - oc.NPOP[op] :]
        stack.append(None)
    elif act == oc.A_MARK:
        w.marks.append(len(stack))
    elif act == oc.A_POP:
        if (w.marks and len(stack) == w.marks[-1]) or not stack:
            del stack[w.pop_mark(pos) :]  # pickle's POP on an empty slice pops the MARK
        else:
            stack.pop()
    elif act == oc.A_POP_MARK:
        del stack[w.pop_mark(pos) :]
    elif act == oc.A_MEMOIZE:
        w.define(w.dense + len(w.sparse), pos)
    elif act == oc.A_PUT:
        w.define(w.buf[pos + 1] if nxt - pos == 2 else oc.U4(w.buf, pos + 1)[0], pos)
    elif act == oc.A_GET:
        w.get(w.buf[pos + 1] if nxt - pos == 2 else oc.U4(w.buf, pos + 1)[0], pos)
    elif act == oc.A_FRAME:
        if pos + 9 + oc.U8(w.buf, pos + 1)[0] > w.end:
            raise w.cut(pos, f"a FRAME of {oc.U8(w.buf, pos + 1)[0]} bytes")
    elif act == oc.A_PROTO:
        if w.buf[pos + 1] > oc.HIGHEST_PROTOCOL:
            raise w.fail(pos, f"names unknown protocol {w.buf[pos + 1]}")
        w.proto = w.buf[pos + 1]
    elif act == oc.A_STOP:
        if len(stack) <= (w.marks[-1] if w.marks else 0):
            raise w.fail(pos, "with nothing on the stack")
        return True
    elif op in (_OP["EXT1"], _OP["EXT2"], _OP["EXT4"]):
        code = w.buf[pos + 1] if nxt - pos == 2 else int.from_bytes(w.buf[pos + 1 : nxt], "little")
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        stack.append(w.name(key if key is not None else ("copyreg", f"<extension {code}>"), pos))
    elif op == _OP["DUP"]:
        w.need(pos, 1)
        stack.append(stack[-1])
    elif op == _OP["BINPERSID"] or op == _OP["READONLY_BUFFER"]:
        w.need(pos, 1)
        stack[-1] = None
    else:  # NEXT_BUFFER, and any other push
        stack.append(None)
    return False


def _is_text(w: Walk, v: Any) -> bool:
    return type(v) is Text or (type(v) is int and w.buf[v] in _UNICODE_OPS)


def _as_text(w: Walk, v: Text | int) -> Text:
    """A text operand as a :class:`Text`: a short one is on the stack as its opcode's offset."""
    if type(v) is Text:
        return v
    assert type(v) is int
    start = v + oc.HEAD[w.buf[v]]
    return Text(start, extent(w.buf, v, w.end) - start)


def _encoded(w: Walk, args: EncodeArgs) -> Blob | None:
    """The bytes ``_codecs.encode(text, encoding)`` makes of a long text payload, when the
    encoding is latin-1 (what protocols 0-2 write): a payload a torch loader may read."""
    text, encoding = args.text, args.encoding
    if encoding not in ("latin1", "latin-1", "iso-8859-1") or text.n > _PAYLOAD_MAX:
        return None
    raw = bytes(w.buf[text.start : text.start + text.n])
    try:
        data = raw.decode("utf-8", "surrogatepass").encode("latin-1")
    except UnicodeError:
        return None
    return Blob(text.start, len(data), data)


def walk_record(w: Walk, pos: int) -> int:
    """Walk one pickle from ``pos`` to its STOP; return the offset after it.

    The hot loop: fixed-size pushes, MEMOIZE with dense ids, BINGET, MARK, tuples, empty
    containers, appends and payloads are handled inline; everything else by :func:`_fixed_op`
    and :func:`_text_op`. A short string is pushed as its opcode's offset (an ``int``) and only
    decoded if a ``STACK_GLOBAL`` uses it.
    """
    a, buf, end = w.a, w.buf, w.end
    stack, counts, marks, values = w.stack, a.counts, w.marks, w.values
    push, step_of, form_of, head_of = stack.append, _FAST_STEP, oc.FORM, oc.HEAD
    action_of, npop_of, counted = oc.ACTION, oc.NPOP, _COUNTED_OPS
    memoize, binget, names = oc.MEMOIZE_OP, oc.BINGET_OP, _NAME_OPS
    a_mark, a_tuplen, a_tuple = oc.A_MARK, oc.A_TUPLEN, oc.A_TUPLE
    a_empty_lo, a_empty_hi, a_append, a_setitems = (
        oc.A_EMPTY_LIST,
        oc.A_EMPTY_TUPLE,
        oc.A_APPEND,
        oc.A_SETITEMS,
    )
    f_len1, f_len8, f_fixed = oc.F_LEN1, oc.F_LEN8U, oc.F_FIXED
    n_ops, skipped, hi = 0, 0, 0
    track = buf[pos] != oc.PROTO_OP  # protocol 0 or 1: which, by the opcodes it uses
    try:
        while True:
            if pos >= end:
                raise w.cut(pos, "the opcode stream (no STOP)")
            op = buf[pos]
            n_ops += 1
            if track and _OPPROTO[op] > hi:
                hi = _OPPROTO[op]
            step = step_of[op]
            if step:
                push(None)
                pos += step
                continue
            if op == memoize and not w.sparse and len(stack) > (marks[-1] if marks else 0):
                if stack[-1] is not None:
                    values[w.dense] = stack[-1]
                w.dense += 1
                pos += 1
                continue
            if op == binget and pos + 2 <= end and buf[pos + 1] < w.dense:
                push(values.get(buf[pos + 1]))
                pos += 2
                continue
            act = action_of[op]
            if act == a_mark:
                marks.append(len(stack))
                pos += 1
                continue
            if act == a_tuplen or (act == a_tuple and marks):
                m = len(stack) - npop_of[op] if act == a_tuplen else marks.pop()
                if m < (marks[-1] if marks else 0):
                    raise w.fail(pos, "underflows the stack")
                one = stack[m] if len(stack) == m + 1 and type(stack[m]) is Blob else None
                if len(stack) == m + 2 and _is_text(w, stack[m]):  # (text, encoding)
                    one = EncodeArgs(_as_text(w, stack[m]), w.text(stack[m + 1]))
                del stack[m:]
                push(one)  # (payload,): kept, for a REDUCE of torch's _load_from_bytes
                pos += 1
                continue
            if a_empty_lo <= act <= a_empty_hi:
                push(None)
                pos += 1
                continue
            if a_append <= act <= a_setitems:  # APPEND, APPENDS, SETITEM, SETITEMS
                _add_items(w, act, pos)
                pos += 1
                continue
            form = form_of[op]
            if form == f_fixed:  # extent's first case, inline: a call costs more than the step
                nxt: int = pos + head_of[op]
                if nxt > end:
                    raise extent_error(CUT, buf, pos, end, a.path)
            else:
                nxt = extent(buf, pos, end)
                if nxt < 0:
                    raise extent_error(nxt, buf, pos, end, a.path)
            if f_len1 <= form <= f_len8:
                hdr = pos + head_of[op]
                n = nxt - hdr
                if n <= _NAME_MAX and op in names:
                    push(pos)
                else:
                    skipped += n
                    push(
                        Blob(hdr, n)
                        if op in _BYTES_OPS
                        else Text(hdr, n)
                        if op in _UNICODE_OPS
                        else None
                    )
                pos = nxt
                continue
            if op in counted:
                name = oc.OPNAME[op]
                counts[name] = counts.get(name, 0) + 1
            if form == f_fixed:
                if _fixed_op(w, op, pos, nxt):
                    w.hi = hi
                    return nxt
            else:
                _text_op(w, op, pos, nxt)
            pos = nxt
    finally:
        a.opcodes += n_ops
        a.bytes_read -= skipped


def _add_items(w: Walk, act: int, pos: int) -> None:
    stack = w.stack
    if act == oc.A_APPEND or act == oc.A_SETITEM:
        n = 1 if act == oc.A_APPEND else 2
        w.need(pos, n + 1)
        del stack[len(stack) - n :]
        return
    m = w.pop_mark(pos)
    if m < 1 or (w.marks and m <= w.marks[-1]):
        raise w.fail(pos, "with no container below its items")
    if act == oc.A_SETITEMS and (len(stack) - m) % 2:
        raise w.fail(pos, "with an odd number of items")
    del stack[m:]
