"""What is refused before a pickle is unpickled whole: the walk :func:`check_before_load`.

CPython's unpickler sizes its memo array to the largest id a ``PUT``/``BINPUT``/``LONG_BINPUT``
names (a ``LONG_BINPUT`` id near 2**32 asks for 64 GiB, and gets it where memory is
overcommitted), and builds a set or dict of ints crafted to hash alike in O(N**2)
(:mod:`pickleshard.picklekit.hashalike`). :func:`check_before_load` walks one pickle with
:func:`~pickleshard.picklekit.extent.extent` and refuses either first.
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptPickleError, SampleLimitError
from .extent import PAST_END, extent, extent_error
from .hashalike import HASH_ALIKE_MAX, LONG_OPS, AlikeInts, hash_flood_message, int_argument
from .opcodes import A_PUT, ACTION, ARGLEN, F_FIXED, FORM, STOP_OP, U4

__all__ = ["check_before_load"]

# Size of each fixed-size opcode the memo check steps over unread (not a PUT, not STOP), else 0.
_STEP = [
    1 + ARGLEN[b] if FORM[b] == F_FIXED and ACTION[b] != A_PUT and b != STOP_OP else 0
    for b in range(256)
]


def check_before_load(buf: Any, pos: int, size: int, name: str) -> int:
    """Refuse a memo id that cannot be legitimate, or ints crafted to hash alike, in the pickle
    starting at ``buf[pos]``.

    ``buf`` holds the whole ``size``-byte file (bytes or mmap). A pickle of ``size`` bytes
    defines at most ``size`` memo entries, so a ``PUT``, ``BINPUT`` or ``LONG_BINPUT`` id above
    ``size`` is corrupt: raises :class:`CorruptPickleError` naming ``name``, the opcode's offset,
    the id and the limit. A payload length past the end of the file raises
    :class:`~pickleshard.errors.TruncatedPickleError` the same way (:func:`extent_error`), before
    the unpickler allocates it (CPython sizes a ``BYTEARRAY8`` to the declared length, and a
    failed allocation of 2**62 bytes also prints a stray ``SystemError`` traceback). More than
    :data:`~pickleshard.picklekit.hashalike.HASH_ALIKE_MAX` distinct ints with one hash raise
    :class:`~pickleshard.errors.SampleLimitError` at the pickle's offset. The walk
    steps over opcodes and payloads, reading only opcode bytes, lengths and memo ids. Returns the
    offset just after the pickle's STOP, or the offset of the first opcode it cannot read
    (unknown, negative length, running past the end): what is wrong there is the unpickler's to
    report, with the same error it always gave.
    """
    step_of, first, alike = _STEP, pos, AlikeInts()
    while pos < size:
        op = buf[pos]
        step = step_of[op]
        if step:
            pos += step
            continue
        if op == STOP_OP:
            _check_alike(alike, first, name)
            return pos + 1
        nxt = extent(buf, pos, size)
        if nxt < 0:
            if nxt == PAST_END:
                raise extent_error(nxt, buf, pos, size, name)
            _check_alike(alike, first, name)
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
        elif op in LONG_OPS:
            try:
                alike.add(*int_argument(buf, pos, nxt))
            except ValueError:  # text that is no int: the unpickler's to report
                _check_alike(alike, first, name)
                return pos
        pos = nxt
    _check_alike(alike, first, name)
    return pos


def _check_alike(alike: AlikeInts, first: int, name: str) -> None:
    most = alike.most_alike()
    if most > HASH_ALIKE_MAX:
        raise SampleLimitError(name, hash_flood_message(most), offset=first)


def _check_id(mid: int, pos: int, size: int, name: str) -> None:
    if mid > size:
        raise CorruptPickleError(
            name,
            f"memo id {mid} is larger than the file ({size} bytes), which can define at most "
            f"{size} memo entries; refused before unpickling sizes its memo to it",
            offset=pos,
        )
