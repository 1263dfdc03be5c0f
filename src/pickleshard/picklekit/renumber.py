"""The opcodes a span rewrite emits in place of the file's: memo stores and loads at renumbered
ids, the prologue of persistent ids that stand for a span's external memo values, and the error
for an opcode that cannot be stepped over. Shared by :func:`~pickleshard.picklekit.rewrite.rewrite_span`
and its compiled twin (``pickleshard._cscan``), so both write the same bytes."""

from __future__ import annotations

import pickle
import struct
from typing import Any

from . import opcodes as oc
from .extent import NEGATIVE, UNKNOWN

__all__ = ["GETS", "PUTS", "encode_get", "encode_put", "proto_head", "step_error"]

_HEADS: dict[tuple[int, int], bytes] = {}
_P4 = struct.Struct("<I").pack


def encode_put(local_id: int) -> bytes:
    """``BINPUT`` / ``LONG_BINPUT`` storing the top of the stack at memo id ``local_id``."""
    return bytes((oc.BINPUT_OP, local_id)) if local_id < 256 else b"r" + _P4(local_id)


def encode_get(local_id: int) -> bytes:
    """``BINGET`` / ``LONG_BINGET`` pushing memo id ``local_id``."""
    return bytes((oc.BINGET_OP, local_id)) if local_id < 256 else b"j" + _P4(local_id)


GETS = [encode_get(j) for j in range(256)]
PUTS = [encode_put(j) for j in range(256)]


def proto_head(protocol: int, n_ext: int) -> bytes:
    """``PROTO p``, then persistent ids 0..n_ext-1 stored at memo ids 0..n_ext-1."""
    got = _HEADS.get((protocol, n_ext))
    if got is None:
        parts = [bytes((oc.PROTO_OP, protocol))]
        for j in range(n_ext):
            pid = (
                bytes((oc.BININT1_OP, j))
                if j < 256
                else bytes((oc.BININT_OP,)) + j.to_bytes(4, "little")
            )
            parts.append(pid + bytes((oc.BINPERSID_OP,)) + encode_put(j) + bytes((oc.POP_OP,)))
        got = b"".join(parts)
        if n_ext < 64:
            _HEADS[(protocol, n_ext)] = got
    return got


def step_error(code: int, buf: Any, i: int, here: int, end: int) -> Exception:
    """The rewrite's error for :func:`extent`'s ``code`` at ``buf[i]`` (file offset ``here + i``)
    of a span ending at ``end``: what the reader turns into an error naming the file."""
    op = buf[i]
    if code == UNKNOWN:
        return pickle.UnpicklingError(f"unknown opcode 0x{op:02x} at byte {here + i}")
    if code == NEGATIVE:  # BINSTRING's signed length: stepping back by it would loop forever
        n = oc.I4(buf, i + 1)[0]
        return pickle.UnpicklingError(
            f"{oc.OPNAME[op]} at byte {here + i} declares a negative length {n}"
        )
    return EOFError(f"opcode at byte {here + i} runs past the span end {end}")
