"""The memo-id guard: refuse a memo id no pickle of its size can hold, before unpickling.

CPython's unpickler sizes its memo array to the largest id a ``PUT``/``BINPUT``/``LONG_BINPUT``
names (a ``LONG_BINPUT`` id near 2**32 asks for 64 GiB, and gets it where memory is
overcommitted). :func:`check_memo_ids` walks one pickle with
:func:`~pickleshard.picklekit.extent.extent` and refuses such an id first.
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptPickleError
from .extent import PAST_END, extent, extent_error
from .opcodes import A_PUT, ACTION, ARGLEN, F_FIXED, FORM, STOP_OP, U4

__all__ = ["check_memo_ids"]

# Size of each fixed-size opcode the memo check steps over unread (not a PUT, not STOP), else 0.
_STEP = [
    1 + ARGLEN[b] if FORM[b] == F_FIXED and ACTION[b] != A_PUT and b != STOP_OP else 0
    for b in range(256)
]


def check_memo_ids(buf: Any, pos: int, size: int, name: str) -> int:
    """Refuse a memo id that cannot be legitimate in the pickle starting at ``buf[pos]``.

    ``buf`` holds the whole ``size``-byte file (bytes or mmap). A pickle of ``size`` bytes
    defines at most ``size`` memo entries, so a ``PUT``, ``BINPUT`` or ``LONG_BINPUT`` id above
    ``size`` is corrupt: raises :class:`CorruptPickleError` naming ``name``, the opcode's offset,
    the id and the limit. A payload length past the end of the file raises
    :class:`~pickleshard.errors.TruncatedPickleError` the same way (:func:`extent_error`), before
    the unpickler allocates it (CPython sizes a ``BYTEARRAY8`` to the declared length, and a
    failed allocation of 2**62 bytes also prints a stray ``SystemError`` traceback). The walk
    steps over opcodes and payloads, reading only opcode bytes, lengths and memo ids. Returns the
    offset just after the pickle's STOP, or the offset of the first opcode it cannot read
    (unknown, negative length, running past the end): what is wrong there is the unpickler's to
    report, with the same error it always gave.
    """
    step_of = _STEP
    while pos < size:
        op = buf[pos]
        step = step_of[op]
        if step:
            pos += step
            continue
        if op == STOP_OP:
            return pos + 1
        nxt = extent(buf, pos, size)
        if nxt < 0:
            if nxt == PAST_END:
                raise extent_error(nxt, buf, pos, size, name)
            return pos
        if ACTION[op] == A_PUT:
            if FORM[op] == F_FIXED:
                mid = buf[pos + 1] if ARGLEN[op] == 1 else U4(buf, pos + 1)[0]
            else:
                try:
                    mid = int(buf[pos + 1 : nxt - 1])
                except ValueError:
                    return pos
            _check_id(mid, pos, size, name)
        pos = nxt
    return pos


def _check_id(mid: int, pos: int, size: int, name: str) -> None:
    if mid > size:
        raise CorruptPickleError(
            name,
            f"memo id {mid} is larger than the file ({size} bytes), which can define at most "
            f"{size} memo entries; refused before unpickling sizes its memo to it",
            offset=pos,
        )
