"""The pickle opcode tables that every walk of pickleshard steps with: data, not a chain of ifs.

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
``HEAD[b]`` is the size of an opcode's fixed part (the opcode byte and a fixed argument or a
length prefix; 1 for text opcodes, whose lines are searched for). Where an opcode ends, its
payload included, is :func:`pickleshard.picklekit.extent.extent`'s to say.
"""

from __future__ import annotations

import pickle
import pickletools
import struct
from typing import Final

__all__ = ["ACTION", "ARGLEN", "COPY_STEP", "FINDS_CLASS", "FORM", "NPOP", "OPNAME", "PAYLOAD"]
__all__ += ["HEAD", "NAME_TEXT", "PUSH_STEP", "REFUSED"]


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
# Opcodes whose loading calls the unpickler's ``find_class`` (they name a global).
FINDS_CLASS: list[bool] = [
    OPNAME[b] in ("GLOBAL", "STACK_GLOBAL", "INST", "EXT1", "EXT2", "EXT4") for b in range(256)
]
# Opcodes that push a string a STACK_GLOBAL may take as its module or name (the audit decodes
# them); the walkers note which memo key stores one (Walked.strs).
_NAMES = ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "SHORT_BINSTRING", "BINSTRING")
NAME_TEXT: list[bool] = [OPNAME[b] in (*_NAMES, "STRING", "UNICODE") for b in range(256)]
STACK_GLOBAL_OP: Final = 0x93
# Total size of each fixed-size opcode that only pushes a value (the scanner's fast path), and of
# each fixed-size opcode the span rewriter copies as is (not a memo opcode, not FRAME, not one
# that names a global: the rewriter counts those); else 0.
# The EXT lookups name a global: never on the fast path, so that every walk counts them.
PUSH_STEP: list[int] = [
    1 + ARGLEN[b] if ACTION[b] == A_PUSH and FORM[b] == F_FIXED and not FINDS_CLASS[b] else 0
    for b in range(256)
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
HEAD: list[int] = [1 + ARGLEN[b] if FORM[b] != F_BAD else 1 for b in range(256)]
U4, I4, U8 = (struct.Struct(f).unpack_from for f in ("<I", "<i", "<Q"))
