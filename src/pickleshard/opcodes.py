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

import pickletools
import struct
from typing import Final

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

PROTO_OP: Final = 0x80
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
