"""Where an opcode and its payload end: the one stepper every walk of a pickle is built on.

:func:`extent` answers, for the opcode at ``buf[pos]`` of a stream that ends at ``end``, the
offset just after it: its argument (fixed size, a length prefix and the payload it counts, or one
or two newline-terminated text lines) included. Every length is checked against the bytes left
before it is trusted (``BINSTRING``'s signed length too: a negative one is refused, never
stepped back by); text lines are searched for only up to ``end``. It never raises on bad bytes:
it returns one of the negative codes below, and :func:`extent_error` turns a code into the
:class:`~pickleshard.errors.CorruptPickleError` / :class:`~pickleshard.errors.TruncatedPickleError`
naming the file and the opcode's offset. :func:`opcode_end` is the two together.

``buf`` is bytes, bytearray or an mmap (anything with ``find`` and ``struct.unpack_from``). It
may hold fewer bytes than ``end`` (a window of a longer stream): when the opcode's fixed part or
its text line is not all in ``buf`` but may still end before ``end``, the code is :data:`SHORT`
(read more and ask again). A payload never has to be in ``buf``.

Its first case, a fixed-size opcode, is ``pos + HEAD[op]`` bounded by ``end``: the Python walks
take that one inline (a function call costs more than the step) and call :func:`extent` for the
rest; the error of a cut there is ``extent_error(CUT, ...)``.

The compiled core's ``_extent`` (``pickleshard/_cscan.pyx``) is this function's twin, an inline
C function over a pointer and the bytes present, returning the same offsets and codes; the
compiled walker, rewrite and checks step with it.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from ..errors import CorruptPickleError, TruncatedPickleError
from .opcodes import (
    ARGLEN,
    F_BAD,
    F_FIXED,
    F_LEN1,
    F_LEN4S,
    F_LEN4U,
    F_LEN8U,
    F_LINE2,
    FORM,
    HEAD,
    OPNAME,
)

__all__ = ["CUT", "NEGATIVE", "PAST_END", "SHORT", "UNKNOWN", "extent", "extent_error"]
__all__ += ["opcode_end"]

CUT: Final = -1  # the argument, length prefix or text line runs past ``end``
PAST_END: Final = -2  # the length prefix is there; the payload it counts runs past ``end``
NEGATIVE: Final = -3  # BINSTRING's signed length prefix is negative
UNKNOWN: Final = -4  # no such opcode
SHORT: Final = -5  # the fixed part or text line is past the bytes ``buf`` holds, not past ``end``

_FORMAT = {F_LEN4S: "<i", F_LEN4U: "<I", F_LEN8U: "<Q"}
_LENGTH = {form: struct.Struct(f).unpack_from for form, f in _FORMAT.items()}


def extent(buf: Any, pos: int, end: int) -> int:
    """The offset just after the opcode at ``buf[pos]`` (``pos < end``, ``pos < len(buf)``),
    argument and payload included, at most ``end``; else a negative code (see the module)."""
    op = buf[pos]
    form = FORM[op]
    if form == F_FIXED:
        nxt: int = pos + 1 + ARGLEN[op]
        if nxt > end:
            return CUT
        return nxt if nxt <= len(buf) else SHORT
    if form > F_LEN8U:  # F_LINE, F_LINE2
        nl = buf.find(b"\n", pos + 1, end)
        if nl >= 0 and form == F_LINE2:
            nl = buf.find(b"\n", nl + 1, end)
        if nl < 0:
            return SHORT if len(buf) < end else CUT
        return nl + 1  # type: ignore[no-any-return]
    if form == F_BAD:
        return UNKNOWN
    head = pos + HEAD[op]
    if head > end:
        return CUT
    try:
        n = buf[pos + 1] if form == F_LEN1 else _LENGTH[form](buf, pos + 1)[0]
    except (IndexError, struct.error):  # the prefix is past the bytes buf holds
        return SHORT
    if n < 0:
        return NEGATIVE
    if n > end - head:
        return PAST_END
    return head + n  # type: ignore[no-any-return]


def extent_error(code: int, buf: Any, pos: int, end: int, name: str) -> CorruptPickleError:
    """The error for :func:`extent`'s ``code`` at ``pos`` of the stream ``buf[:end]`` of file
    ``name``: a :class:`TruncatedPickleError` for what runs past the end, else a
    :class:`CorruptPickleError`; each names the opcode and has ``offset=pos``."""
    op = buf[pos]
    what, form = OPNAME[op], FORM[op]
    if code == UNKNOWN:
        return CorruptPickleError(name, f"unknown opcode 0x{op:02x}", offset=pos)
    if code in (NEGATIVE, PAST_END):
        n = _LENGTH[form](buf, pos + 1)[0] if form != F_LEN1 else buf[pos + 1]
        if code == NEGATIVE:
            return CorruptPickleError(name, f"{what} declares a negative length {n}", offset=pos)
        cut = f"the {n}-byte payload of {what} ({end - pos} bytes left)"
    elif form == F_FIXED:
        cut = f"the argument of {what}"
    elif form > F_LEN8U:
        cut = f"the text argument of {what}"
    else:
        cut = f"the length of {what}"
    return TruncatedPickleError(name, f"stream ends inside {cut}", offset=pos)


def opcode_end(buf: Any, pos: int, end: int, name: str) -> int:
    """:func:`extent`, or its error raised: the end of the opcode at ``buf[pos]``, payload
    included, in the ``end``-byte stream of file ``name`` (``buf`` holds all of it)."""
    nxt = extent(buf, pos, end)
    if nxt < 0:
        raise extent_error(nxt, buf, pos, end, name)
    return nxt
