"""Values pickled as bare opcodes, to splice into another pickle stream as one value."""

from __future__ import annotations

import io
import pickle

from .extent import opcode_end
from .opcodes import FRAME_OP, U8

__all__ = ["fast_opcodes"]


def fast_opcodes(obj: object, protocol: int) -> list[memoryview]:
    """``obj`` pickled by the C pickler in fast mode (no memo opcodes), as the pieces of its
    opcodes without ``PROTO``, ``FRAME`` headers and ``STOP``: what another pickle stream can
    splice in as one value."""
    buf = io.BytesIO()
    c = pickle.Pickler(buf, protocol)
    c.fast = True
    c.dump(obj)
    data = buf.getvalue()
    pieces = [memoryview(data)[2:]] if protocol < 4 else _unframed(data)
    pieces[-1] = pieces[-1][:-1]  # STOP
    return pieces


def _unframed(data: bytes) -> list[memoryview]:
    """The opcodes of a protocol 4+ pickle after its PROTO: FRAME contents and the opcodes
    between frames (large payloads, a short last frame), without the FRAME headers."""
    view, pieces, pos, n = memoryview(data), [], 2, len(data)
    while pos < n:
        if data[pos] == FRAME_OP:
            size = int(U8(data, pos + 1)[0])
            pieces.append(view[pos + 9 : pos + 9 + size])
            pos += 9 + size
            continue
        start = pos
        while pos < n and data[pos] != FRAME_OP:
            pos = opcode_end(data, pos, n, "<pickle.dumps>")
        pieces.append(view[start:pos])
    return pieces
