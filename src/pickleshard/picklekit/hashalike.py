"""Ints crafted to hash alike, counted before a set or dict of them is built.

CPython hashes an int as ``n mod (2**61 - 1)`` (sign kept), so ints that differ by multiples of
``2**61 - 1`` all hash alike, and a set or dict of N of them takes O(N**2) comparisons to build:
150,000 take hours, in ``pickle.load`` as anywhere. Only ints of 61 bits or more can share a hash
with another int (besides -1 and -2), and no other key a pickle can hold without a global can be
made to: ``str`` and ``bytes`` hashes are salted per process, a float's hash class holds a few
dozen floats at most, and a tuple or frozenset hashes alike only when its elements do. So it is
enough to count, for every int of 8 or more bytes a pickle holds, its hash, and to refuse when
more than :data:`HASH_ALIKE_MAX` *distinct* ones share one (distinct: told apart by the salted
hash of their encoding, so one value written many times, a sentinel or a repeated id, counts
once). No legitimate data comes near: two random 64-bit ids share a hash with odds of 2**-61.

The pre-load walk (:func:`pickleshard.picklekit.preload.check_before_load`) counts them before the
whole-file load of an index; the inert unpickler counts them as it evaluates a span, so
``inspect`` and the scanner never build such a set.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

__all__ = ["HASH_ALIKE_MAX", "LONG_OPS", "AlikeInts", "hash_flood_message", "int_argument"]

HASH_ALIKE_MAX = 1024
"""The most distinct ints one pickle may hold with one hash (1,024 build in milliseconds)."""

_LONG1, _LONG4 = 0x8A, 0x8B
LONG_OPS = frozenset((_LONG1, _LONG4, ord("I"), ord("L")))
"""The opcodes that can push an int of 61 bits or more."""
_ALONE = 2**61 - 1  # an int nearer 0 than this hashes to itself (-1 aside): no other shares it


def int_argument(buf: Any, pos: int, end: int) -> tuple[int, bytes]:
    """The int the opcode at ``buf[pos]`` (one of :data:`LONG_OPS`, ending just before ``end``)
    pushes, as :mod:`pickle` reads it, and its argument's bytes; ``ValueError`` for text that is
    no int (the unpickler's to report)."""
    op = buf[pos]
    if op in (_LONG1, _LONG4):
        raw = bytes(buf[pos + (2 if op == _LONG1 else 5) : end])
        return int.from_bytes(raw, "little", signed=True), raw
    raw = bytes(buf[pos + 1 : end - 1])  # INT or LONG: text (LONG's ends in L), base as int(_, 0)
    if raw in (b"00", b"01"):  # protocol 0's False and True
        return raw == b"01", raw
    return int(raw[:-1] if raw.endswith(b"L") else raw, 0), raw


class AlikeInts:
    """The ints of one pickle that may hash alike, added as they are met; :meth:`most_alike` is
    the size of the largest group of distinct ones with one hash.

    Two ``int64`` per int added (its hash, its encoding's salted hash): the bytes of the big ints
    a pickle holds, never more. :meth:`add` returns that size once it is over
    :data:`HASH_ALIKE_MAX` (counted at doubling counts, so a caller building as it goes stops
    before it has built twice the bound), and 0 otherwise; once over, :attr:`over` keeps it and
    every later :meth:`add` returns it.
    """

    __slots__ = ("_check_at", "_hashes", "_raws", "over")

    def __init__(self) -> None:
        self._hashes, self._raws = array("q"), array("q")
        self._check_at = HASH_ALIKE_MAX + 1
        self.over = 0

    def add(self, value: int, raw: bytes) -> int:
        """Count ``value``, which a pickle encodes as ``raw``, if it can share its hash."""
        if self.over or -_ALONE < value < _ALONE:
            return self.over
        self._hashes.append(hash(value))
        self._raws.append(hash(raw))
        if len(self._hashes) < self._check_at:
            return 0
        self._check_at *= 2
        most = self.most_alike()
        self.over = most if most > HASH_ALIKE_MAX else 0
        return self.over

    def most_alike(self) -> int:
        """The size of the largest group of distinct ints with one hash (0 while at most
        :data:`HASH_ALIKE_MAX` ints are held)."""
        if len(self._hashes) <= HASH_ALIKE_MAX:
            return 0
        pairs = np.stack(
            [np.frombuffer(self._hashes, np.int64), np.frombuffer(self._raws, np.int64)]
        )
        distinct = np.unique(pairs, axis=1)
        return int(np.unique(distinct[0], return_counts=True)[1].max())


def hash_flood_message(alike: int) -> str:
    """What a refusal of ``alike`` distinct ints with one hash says (the caller adds where)."""
    return (
        f"at least {alike:,} distinct ints of one pickle hash alike (at most {HASH_ALIKE_MAX:,} may): a "
        "set or dict of them takes hours to build (a hash flood, as pickle.load would meet "
        "it); refused before it is built. Ints written to collide are crafted: do not load "
        "this file; data of your own with such ints stores them as a numpy int array instead"
    )
