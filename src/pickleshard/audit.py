"""The globals audit: every global a pickle file names, found by reading opcodes only.

:func:`audit_buffer` walks every pickle of a file (any protocol, 0-5, and several appended one
after another) with the opcode tables of :mod:`pickleshard.opcodes`, seeking over payloads. It
keeps a symbolic stack that knows only short strings and global references, so it can name:

- ``GLOBAL`` and ``INST`` (module and name are the opcode's text argument);
- ``STACK_GLOBAL`` (its two string operands, pushed directly or through the memo by ``PUT`` /
  ``MEMOIZE`` and ``GET``: memo ids are tracked exactly as the unpickler assigns them);
- ``EXT1`` / ``EXT2`` / ``EXT4`` (the code is looked up in :mod:`copyreg`'s extension registry as
  data; an unregistered code is named ``copyreg.<extension N>``).

Nothing is imported or called. A ``STACK_GLOBAL`` whose operands are not string constants (they
were computed by a call, or are not strings) cannot be named from the bytes: it is listed as
``?.?`` with verdict "dangerous", since CPython's pickler never writes one. Each global gets its
number of references, the number of ``REDUCE`` / ``NEWOBJ`` / ``NEWOBJ_EX`` / ``OBJ`` / ``INST``
calls made on it, and its :func:`~pickleshard.allowlist.classify_global` verdict.

Structural damage (truncation, unknown opcodes, stack underflow, a ``GET`` of a memo id never
stored) raises the :mod:`pickleshard.errors` classes with the file and offset.
"""

from __future__ import annotations

import codecs
import contextlib
import copyreg
import gc
import pickle
import pickletools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import opcodes as oc
from .allowlist import Verdict, classify_global
from .errors import (
    CorruptPickleError,
    EmptyPickleError,
    NotAPickleError,
    PickleshardError,
    TruncatedPickleError,
)

__all__ = ["Audit", "GlobalUse", "audit_buffer", "locate_global"]

GlobalKey = tuple[str, str]
UNRESOLVED: GlobalKey = ("?", "?")

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


_MAGIC = {
    b"PK\x03\x04": "a zip archive (torch.save writes these: open it with torch.load)",
    b"\x93NUM": "a .npy file (open it with numpy.load)",
    b"\x89HDF": "an HDF5 file",
}


_UNFRAMED_OPENERS = frozenset(b"(]})")  # MARK, EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE


@dataclass(frozen=True)
class GlobalUse:
    """One global a file names: ``refs`` opcodes name it, ``calls`` call or instantiate it."""

    module: str
    name: str
    refs: int
    calls: int
    verdict: Verdict

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "global": self.qualname,
            "module": self.module,
            "name": self.name,
            "refs": self.refs,
            "calls": self.calls,
            "verdict": self.verdict,
        }


@dataclass
class Audit:
    """What the audit walk found in one file.

    ``records`` holds ``(start, end after STOP)`` of each pickle; ``protocol`` is the first
    pickle's (0 or 1 when it has no ``PROTO`` opcode, by the opcodes it uses); ``opcodes`` the
    total opcode count; ``counts`` the count of each opcode in :data:`COUNTED` that occurs;
    ``computed_calls`` the calls made on values that no global names (results of other calls);
    ``bytes_read`` the bytes examined (payloads are seeked over); ``builds_on_globals`` the
    ``(offset, global)`` of each ``BUILD`` whose target is a global itself (directly or through
    the memo: a file changing a function or class of the loading process, which the loader
    refuses); ``first_refs`` the offset of the first opcode naming each global.
    """

    path: str
    size: int
    protocol: int = 0
    records: list[tuple[int, int]] = field(default_factory=list)
    opcodes: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    refs: dict[GlobalKey, int] = field(default_factory=dict)
    calls: dict[GlobalKey, int] = field(default_factory=dict)
    computed_calls: int = 0
    bytes_read: int = 0
    builds_on_globals: list[tuple[int, GlobalKey]] = field(default_factory=list)
    first_refs: dict[GlobalKey, int] = field(default_factory=dict)
    first_calls: dict[GlobalKey, int] = field(default_factory=dict)
    nested: list[tuple[int, str, Audit]] = field(default_factory=list)

    def globals(self, allow_globals: Iterable[GlobalKey] = ()) -> list[GlobalUse]:
        """Every global named, in order of first appearance, with its verdict."""
        extra = frozenset(allow_globals)
        out = []
        for key, n in self.refs.items():
            verdict: Verdict = "dangerous" if key == UNRESOLVED else classify_global(*key, extra)
            out.append(GlobalUse(key[0], key[1], n, self.calls.get(key, 0), verdict))
        return out


class _Blob:
    """A ``bytes`` payload on the symbolic stack: where it is, for a nested torch payload."""

    __slots__ = ("n", "start")

    def __init__(self, start: int, n: int) -> None:
        self.start, self.n = start, n


_TORCH_PAYLOAD: GlobalKey = ("torch.storage", "_load_from_bytes")
_BYTES_OPS = frozenset(getattr(pickle, n)[0] for n in ("SHORT_BINBYTES", "BINBYTES", "BINBYTES8"))
_NESTED_DEPTH = 4  # torch payloads inside torch payloads: audited this deep


class _Walk:
    """State of one record's walk: the symbolic stack, marks and memo."""

    def __init__(self, audit: Audit, buf: Any, end: int) -> None:
        self.a, self.buf, self.end = audit, buf, end
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
        buf, op = self.buf, self.buf[v]
        form = oc.FORM[op]
        hdr = 2 if form == oc.F_LEN1 else 9 if form == oc.F_LEN8U else 5
        n = buf[v + 1] if hdr == 2 else int.from_bytes(buf[v + 1 : v + hdr], "little")
        raw = bytes(buf[v + hdr : v + hdr + n])
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

    def lines(self, pos: int, count: int) -> tuple[list[bytes], int]:
        buf, out, at = self.buf, [], pos + 1
        for _ in range(count):
            nl = buf.find(b"\n", at, self.end)
            if nl < 0:
                raise self.cut(pos, f"the text argument of {oc.OPNAME[buf[pos]]}")
            out.append(bytes(buf[at:nl]))
            at = nl + 1
        return out, at


def _memo_id(text: bytes, w: _Walk, pos: int) -> int:
    try:
        return int(text)
    except ValueError:
        raise w.fail(pos, "argument is not a number") from None


def _text_op(w: _Walk, op: int, pos: int) -> int:
    """A text-argument opcode (protocol 0 style); returns the next offset."""
    act = oc.ACTION[op]
    if op in (_OP["GLOBAL"], _OP["INST"]):
        (module, name), nxt = w.lines(pos, 2)
        key = w.name((module.decode("utf-8", "replace"), name.decode("utf-8", "replace")), pos)
        if op == _OP["GLOBAL"]:
            w.stack.append(key)
        else:  # INST: instantiate the class with the items above the mark
            w.call(key, pos)
            del w.stack[w.pop_mark(pos) :]
            w.stack.append(None)
        return nxt
    (text,), nxt = w.lines(pos, 1)
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
    return nxt


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


def _fixed_op(w: _Walk, op: int, pos: int, nxt: int) -> bool:
    """A fixed-size opcode; returns True at STOP."""
    stack, act = w.stack, oc.ACTION[op]
    if act == oc.A_POPN or act == oc.A_TUPLEN:
        n = oc.NPOP[op]
        w.need(pos, n)
        value = None
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
            if stack[-2] == _TORCH_PAYLOAD and type(stack[-1]) is _Blob:
                _audit_nested(w, pos, stack[-1])
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


def _walk_record(w: _Walk, pos: int) -> int:
    """Walk one pickle from ``pos`` to its STOP; return the offset after it.

    The hot loop: fixed-size pushes, MEMOIZE with dense ids, BINGET, MARK, tuples, empty
    containers, appends and payloads are handled inline; everything else by :func:`_fixed_op`
    and :func:`_text_op`. A short string is pushed as its opcode's offset (an ``int``) and only
    decoded if a ``STACK_GLOBAL`` uses it.
    """
    a, buf, end = w.a, w.buf, w.end
    stack, counts, marks, values = w.stack, a.counts, w.marks, w.values
    push, step_of, form_of = stack.append, _FAST_STEP, oc.FORM
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
                one = stack[m] if len(stack) == m + 1 and type(stack[m]) is _Blob else None
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
            if f_len1 <= form <= f_len8:
                hdr = 2 if form == f_len1 else 9 if form == f_len8 else 5
                if pos + hdr > end:
                    raise w.cut(pos, f"the length of {oc.OPNAME[op]}")
                if form == f_len1:
                    n = buf[pos + 1]
                elif form == f_len8:
                    n = oc.U8(buf, pos + 1)[0]
                else:
                    n = (oc.I4 if form == oc.F_LEN4S else oc.U4)(buf, pos + 1)[0]
                    if n < 0:
                        raise w.fail(pos, f"declares a negative length {n}")
                if pos + hdr + n > end:
                    what = f"the {n}-byte payload of {oc.OPNAME[op]} ({end - pos} bytes left)"
                    raise w.cut(pos, what)
                if n <= _NAME_MAX and op in names:
                    push(pos)
                else:
                    skipped += n
                    push(_Blob(pos + hdr, n) if op in _BYTES_OPS else None)
                pos += hdr + n
                continue
            if op in counted:
                name = oc.OPNAME[op]
                counts[name] = counts.get(name, 0) + 1
            if form == f_fixed:
                nxt: int = pos + 1 + oc.ARGLEN[op]
                if nxt > end:
                    raise w.cut(pos, f"the argument of {oc.OPNAME[op]}")
                if _fixed_op(w, op, pos, nxt):
                    w.hi = hi
                    return nxt
                pos = nxt
            elif form in (oc.F_LINE, oc.F_LINE2):
                pos = _text_op(w, op, pos)
            else:
                raise CorruptPickleError(a.path, f"unknown opcode 0x{op:02x}", offset=pos)
    finally:
        a.opcodes += n_ops
        a.bytes_read -= skipped


def _add_items(w: _Walk, act: int, pos: int) -> None:
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


def audit_buffer(buf: Any, size: int, name: str) -> Audit:
    """Audit every pickle in ``buf[:size]`` (bytes or an mmap); see the module docstring."""
    if size == 0:
        raise EmptyPickleError(name, "file is empty; expected a pickle stream", offset=0)
    head = bytes(buf[:4])
    if head in _MAGIC:
        raise NotAPickleError(name, f"{_MAGIC[head]}, not a pickle stream", offset=0)
    if oc.FORM[buf[0]] == oc.F_BAD:
        raise NotAPickleError(name, f"byte 0x{buf[0]:02x} is not a pickle opcode", offset=0)
    audit = Audit(name, size, bytes_read=size)
    pos = 0
    while pos < size:
        if buf[pos] == oc.PROTO_OP and pos + 1 < size and buf[pos + 1] > oc.HIGHEST_PROTOCOL:
            why = f"PROTO opcode names unknown protocol {buf[pos + 1]}"
            raise NotAPickleError(name, why, offset=pos + 1)
        w = _Walk(audit, buf, size)
        collecting = gc.isenabled()
        gc.disable()  # the walk makes no cycles; collections over its memo would cost time
        try:
            nxt = _walk_record(w, pos)
        except CorruptPickleError as exc:
            # as whole-file mode classifies: no PROTO and no protocol 0/1 container opener that
            # ran out of bytes means these bytes were never a pickle
            ran_out = isinstance(exc, TruncatedPickleError)
            if buf[pos] != oc.PROTO_OP and not (ran_out and buf[pos] in _UNFRAMED_OPENERS):
                what = "not a pickle stream" if pos == 0 else f"bytes after pickle ending at {pos}"
                detail = str(exc).removeprefix(f"{name}: ")
                raise NotAPickleError(name, f"{what}: {detail}", offset=pos) from None
            raise
        finally:
            if collecting:
                gc.enable()
        if not audit.records:
            audit.protocol = w.proto if w.proto >= 0 else min(w.hi, 1)
        audit.records.append((pos, nxt))
        pos = nxt
    return audit


def locate_global(file: Any, start: int, key: GlobalKey | None, qualname: str | None) -> int | None:
    """The offset of the opcode behind a refusal in the pickle starting at ``start`` of ``file``
    (a file object or a buffer): the ``BUILD`` on global ``qualname`` when there is one, else the
    first opcode naming ``key``; None when the walk finds neither. Read with ``pread`` or from
    the buffer: the file's position is left as it is (an unpickler is reading it)."""
    import mmap
    import os

    buf: Any
    if isinstance(file, (bytes, bytearray)):
        buf = file
    elif hasattr(file, "getbuffer"):
        buf = bytes(file.getbuffer())  # the walk needs find(); a refusal is rare
    else:
        fd = file.fileno()
        buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if os.fstat(fd).st_size else b""
    size = len(buf)
    audit = Audit("<refusal>", size)
    w = _Walk(audit, buf, size)
    # a damaged stream fails the walk too: what it saw before the damage is still where it is
    with contextlib.suppress(CorruptPickleError):
        _walk_record(w, start)
    if qualname is not None:
        for pos, target in audit.builds_on_globals:
            if ".".join(target) == qualname:
                return pos
        for table in (audit.first_calls, audit.first_refs):
            for k, pos in table.items():
                if ".".join(k) == qualname:
                    return pos
    return audit.first_refs.get(key) if key is not None else None


def _audit_nested(w: _Walk, pos: int, blob: _Blob) -> None:
    """Audit the pickles inside a ``torch.storage._load_from_bytes`` payload (a torch zip, or
    the legacy format: pickles followed by raw storage bytes), counting their globals as this
    file's, named as found inside it (``posix.system`` in a nested payload is dangerous here)."""
    import io
    import zipfile

    outer = w.a
    if outer.path.count("[torch payload") >= _NESTED_DEPTH:
        return
    data = bytes(w.buf[blob.start : blob.start + blob.n])
    members: list[tuple[str, bytes]] = []
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for info in z.infolist():
                    if info.filename.endswith(".pkl") and info.file_size <= 64 << 20:
                        members.append((info.filename, z.read(info)))
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError):
            return
    else:
        members.append(("", data))
    for member, body in members:
        name = f"{outer.path}[torch payload at byte {pos}]{'/' + member if member else ''}"
        inner = Audit(name, len(body), bytes_read=len(body))
        at = 0
        while at < len(body):  # legacy: pickles, then raw storage bytes the walk stops at
            iw = _Walk(inner, body, len(body))
            try:
                at = _walk_record(iw, at)
            except PickleshardError:
                break
            inner.records.append((at, at))
        outer.nested.append((pos, member, inner))
        torch_allows = _torch_weights_only_globals()
        for key, n in inner.refs.items():
            if _torch_admits(key, torch_allows):
                continue  # torch's weights_only loader, which reads the payload, admits it
            outer.refs[key] = outer.refs.get(key, 0) + n
            outer.first_refs.setdefault(key, pos)
            if key in inner.calls:
                outer.calls[key] = outer.calls.get(key, 0) + inner.calls[key]
        outer.builds_on_globals.extend((pos, key) for _, key in inner.builds_on_globals)


def _torch_weights_only_globals() -> frozenset[str] | None:
    """The globals ``torch.load(weights_only=True)`` admits (what reads a nested payload),
    when torch is imported already; None otherwise (the audit never imports it), and then
    :func:`_torch_admits` guesses by name."""
    import sys

    wo = sys.modules.get("torch._weights_only_unpickler")
    serialization = sys.modules.get("torch.serialization")
    if wo is None or serialization is None:
        return None
    names = set(wo._get_allowed_globals())
    for g in serialization.get_safe_globals():
        obj = g[0] if isinstance(g, tuple) else g
        names.add(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
    return frozenset(names)


def _torch_admits(key: GlobalKey, names: frozenset[str] | None) -> bool:
    """Whether torch's weights_only loader admits global ``key`` in a nested payload: by its
    own list when torch is imported, else by the shapes of what ``torch.save`` writes (the
    allowlist's own globals, storage classes, dtypes such as ``torch.float32``)."""
    if classify_global(*key) == "dangerous":
        return False
    if names is not None:
        return ".".join(key) in names
    module, name = key
    return (
        classify_global(module, name) == "allowed"
        or (module.split(".")[0] == "torch" and name.endswith("Storage"))
        or (module == "torch" and name.isidentifier() and name[:1].islower())
    )
