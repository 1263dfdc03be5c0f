"""CIFAR-like batch files as the producers write them, for the layout tests.

CIFAR-10/100's "python version" batches are dicts pickled at protocol 2 by Python 2's cPickle
(numpy 1.x): ``{"batch_label": str, "labels": [int], "data": uint8 (N, 3072), "filenames":
[str]}`` (CIFAR-100: ``fine_labels`` and ``coarse_labels``), where a Python 2 ``str`` is
``SHORT_BINSTRING``/``BINSTRING`` and an array is numpy's ``_reconstruct`` + ``BUILD`` with its
bytes as one ``BINSTRING``. No Python 2 is on this machine, so :func:`py2_dumps` writes those
opcodes as cPickle does (memo ``BINPUT`` after every memoised object, lists in batches of 1000).
:func:`cifar_batch` builds the object with ``bytes`` where Python 2 had ``str`` (what
``pickle.load(f, encoding="bytes")`` returns).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np


def cifar_batch(n: int, seed: int, *, hundred: bool = False) -> dict[bytes, Any]:
    """A CIFAR-10 (or, ``hundred``, CIFAR-100) batch of ``n`` images, keys and strings as
    ``bytes``."""
    rng = np.random.default_rng(seed)
    out: dict[bytes, Any] = {b"batch_label": f"training batch {seed} of 5".encode()}
    if hundred:
        out[b"fine_labels"] = rng.integers(0, 100, n).tolist()
        out[b"coarse_labels"] = rng.integers(0, 20, n).tolist()
    else:
        out[b"labels"] = rng.integers(0, 10, n).tolist()
    out[b"data"] = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    out[b"filenames"] = [f"img_{seed}_{i}.png".encode() for i in range(n)]
    return out


class _Py2Pickler:
    """Writes what Python 2.7's cPickle writes at protocol 2 for dicts, lists, ints, ``str``
    (given as ``bytes``) and numpy 1.x arrays."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")
        self.n = 0

    def put(self) -> None:
        self.out += b"q" + bytes([self.n]) if self.n < 256 else b"r" + struct.pack("<I", self.n)
        self.n += 1

    def glob(self, module: str, name: str) -> None:
        self.out += b"c" + f"{module}\n{name}\n".encode()
        self.put()

    def save(self, x: Any) -> None:
        out = self.out
        if isinstance(x, bool):
            out += b"\x88" if x else b"\x89"
        elif isinstance(x, int):
            if 0 <= x < 256:
                out += b"K" + bytes([x])
            elif 0 <= x < 65536:
                out += b"M" + struct.pack("<H", x)
            else:
                out += b"J" + struct.pack("<i", x)
        elif isinstance(x, bytes):
            out += b"U" + bytes([len(x)]) if len(x) < 256 else b"T" + struct.pack("<i", len(x))
            out += x
            self.put()
        elif x is None:
            out += b"N"
        elif isinstance(x, tuple):
            if 1 <= len(x) <= 3:
                for v in x:
                    self.save(v)
                out += b"\x85\x86\x87"[len(x) - 1 : len(x)]
            else:
                out += b"("
                for v in x:
                    self.save(v)
                out += b"t"
            self.put()
        elif isinstance(x, list):
            out += b"]"
            self.put()
            for at in range(0, len(x), 1000):
                batch = x[at : at + 1000]
                if len(batch) == 1:
                    self.save(batch[0])
                    out += b"a"
                    continue
                out += b"("
                for v in batch:
                    self.save(v)
                out += b"e"
        elif isinstance(x, dict):
            out += b"}"
            self.put()
            out += b"("
            for k, v in x.items():
                self.save(k)
                self.save(v)
            out += b"u"
        elif isinstance(x, np.ndarray):
            self.array(x)
        else:
            raise TypeError(type(x))

    def array(self, a: np.ndarray) -> None:
        self.glob("numpy.core.multiarray", "_reconstruct")
        self.glob("numpy", "ndarray")
        self.save((0,))
        self.save(b"b")
        self.out += b"\x87"  # TUPLE3 of (ndarray, (0,), 'b')
        self.put()
        self.out += b"R"
        self.put()
        self.out += b"("
        self.save(1)
        self.save(tuple(a.shape))
        self.glob("numpy", "dtype")
        self.save((a.dtype.str[1:].encode(), 0, 1))
        self.out += b"R"
        self.put()
        order = a.dtype.str[0].encode()
        self.save((3, order, None, None, None, -1, -1, 0))
        self.out += b"b"
        self.save(False)
        self.save(np.ascontiguousarray(a).tobytes())
        self.out += b"t"
        self.put()
        self.out += b"b"


def py2_dumps(obj: Any) -> bytes:
    """``obj`` pickled as Python 2.7's ``cPickle.dumps(obj, 2)`` would (``bytes`` standing for
    Python 2 ``str``)."""
    p = _Py2Pickler()
    p.save(obj)
    return bytes(p.out + b".")
