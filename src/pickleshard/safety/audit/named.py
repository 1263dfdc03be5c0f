"""The globals a file names, from the facts the scan's walk kept: the audit in the same pass.

The index build used to walk a file a second time, in Python (:func:`.files.audit_buffer`, about
1.4 us an opcode), to list the globals it names. The scan's walk (compiled or its Python twin,
:mod:`pickleshard.picklekit.walker`) already steps over every opcode: it keeps, per opcode that
names a global, its offset and, for ``STACK_GLOBAL``, the offsets of its two operands; and the
memo keys that store a string. :func:`named_globals` turns those into what
:func:`pickleshard.indexing.openaudit.buffer_globals` gives: ``{(module, name): first offset}``,
decoded exactly as the audit's walk decodes them (:mod:`.walk`).

It answers only where the bytes say so plainly, as every pickler writes them: an operand is
its string opcode (or a ``GET`` of a key that stored one), followed by nothing but memo stores
and frame headers up to the next operand or the ``STACK_GLOBAL``. Anything else (an operand
computed by a call, a ``DUP``, a value the walk replayed, a torch payload whose pickles the
audit reads) gives None, and the audit's own walk runs, as before: never a global fewer than the audit would name. The audit's walk stays the
reference; tests compare the two on the fault corpus and on generated pickles.
"""

from __future__ import annotations

import bisect
import copyreg
from typing import Any

from ...picklekit import opcodes as oc
from ...picklekit.extent import extent
from ...picklekit.walker import Walked
from .model import GlobalKey
from .walk import _TORCH_PAYLOAD, _quoted, _unicode

__all__ = ["named_globals"]

_NAME_MAX = 256  # as the audit's walk: a longer string is never decoded as a name
_UNICODE = frozenset(oc.OPNAME.index(n) for n in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"))
_BYTESTR = frozenset(oc.OPNAME.index(n) for n in ("SHORT_BINSTRING", "BINSTRING"))
_STRING, _UNICODE_TEXT = oc.OPNAME.index("STRING"), oc.OPNAME.index("UNICODE")
_GLOBAL_TEXT = frozenset(oc.OPNAME.index(n) for n in ("GLOBAL", "INST"))
_EXT = frozenset(oc.OPNAME.index(n) for n in ("EXT1", "EXT2", "EXT4"))
_STORES = frozenset(oc.OPNAME.index(n) for n in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"))
_GETS = frozenset(oc.OPNAME.index(n) for n in ("BINGET", "LONG_BINGET", "GET"))


class _Unknown(Exception):
    """The facts do not say plainly: the audit's walk decides."""


def named_globals(buf: Any, w: Walked) -> dict[GlobalKey, int] | None:
    """``{(module, name): offset of the first opcode naming it}`` for the file ``buf[:w.size]``
    that ``w`` walked, as :func:`~pickleshard.indexing.openaudit.buffer_globals` would give it
    (a ``STACK_GLOBAL`` whose operands are not both strings is left out, as there); None when
    the facts do not settle it (see the module docstring)."""
    out: dict[GlobalKey, int] = {}
    named = w.named
    try:
        for i in range(0, len(named), 3):
            pos, a, b = named[i], named[i + 1], named[i + 2]
            key = _key(buf, w, pos, a, b)
            if key is not None and key[0] != "?" and key not in out:
                out[key] = pos
    except _Unknown:
        return None
    # a torch payload's pickles are audited inside it, their globals counted as the file's
    # (:mod:`.torchpayloads`): the audit's walk does that
    return None if _TORCH_PAYLOAD in out else out


def _key(buf: Any, w: Walked, pos: int, a: int, b: int) -> GlobalKey | None:
    op, size = buf[pos], w.size
    nxt = extent(buf, pos, size)
    if nxt < 0:
        raise _Unknown
    if op in _GLOBAL_TEXT:
        lines = bytes(buf[pos + 1 : nxt - 1]).split(b"\n")
        if len(lines) != 2:
            raise _Unknown
        return (lines[0].decode("utf-8", "replace"), lines[1].decode("utf-8", "replace"))
    if op in _EXT:
        code = buf[pos + 1] if nxt - pos == 2 else int.from_bytes(buf[pos + 1 : nxt], "little")
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        return key if key is not None else ("copyreg", f"<extension {code}>")
    if op != oc.STACK_GLOBAL_OP or a < 0 or b < 0:
        raise _Unknown  # an operand that is a container: not what a pickler writes
    module, name = _operand(buf, w, a, b), _operand(buf, w, b, pos)
    return (module, name) if module is not None and name is not None else None


def _after(buf: Any, w: Walked, p: int, skip_stores: bool) -> int:
    """Where the opcode at ``p`` ends, past the memo stores (``skip_stores``) and frame headers
    that follow it."""
    q = extent(buf, p, w.size)
    while 0 <= q < w.size and (buf[q] == oc.FRAME_OP or (skip_stores and buf[q] in _STORES)):
        q = extent(buf, q, w.size)
    return q


def _operand(buf: Any, w: Walked, p: int, following: int) -> str | None:
    """The string the stack value pushed at ``p`` stands for (the next value or the
    ``STACK_GLOBAL`` at ``following``), None when the audit's walk names no string there."""
    if _after(buf, w, p, True) != following:
        raise _Unknown  # the value at p is more than its first opcode
    op = buf[p]
    if op in _GETS:
        k = bisect.bisect_left(w.get_offs, p)
        if k == len(w.get_offs) or w.get_offs[k] != p:
            raise _Unknown
        key = w.get_keys[k]
        s = w.strs.get(key)
        if s is None or _after(buf, w, s, False) != w.defs[key]:
            raise _Unknown  # stored a value the walk did not keep as a string
        return _text(buf, w, s)
    return _text(buf, w, p)


def _text(buf: Any, w: Walked, p: int) -> str | None:
    op = buf[p]
    nxt = extent(buf, p, w.size)
    if op in _UNICODE or op in _BYTESTR:
        raw = bytes(buf[p + oc.HEAD[op] : nxt])
        if len(raw) > _NAME_MAX:
            return None
        return raw.decode("utf-8" if op in _UNICODE else "latin-1", "replace")
    if op in (_STRING, _UNICODE_TEXT):
        (line,) = bytes(buf[p + 1 : nxt - 1]).split(b"\n")
        return _quoted(line) if op == _STRING else _unicode(line)
    if oc.PUSH_STEP[op] or oc.FORM[op] in (oc.F_LEN1, oc.F_LEN4S, oc.F_LEN4U, oc.F_LEN8U):
        return None  # a number, bytes...: the audit's walk has no string for it either
    raise _Unknown
