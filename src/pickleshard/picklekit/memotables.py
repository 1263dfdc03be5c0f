"""Which memo entries each element of a file needs from another: the tables behind external ids.

:class:`ElementTable` is built by the scanner from a file's element spans, memo definitions and
``GET`` opcodes (numpy arrays, sized by the file); :class:`SharedTable` is what the index keeps of
it (the memo keys some element uses but another defines, and the elements defining them), which
:class:`~pickleshard.picklekit.externals.ExternalMemos` resolves by replaying those elements.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ElementTable", "MemoRefusal", "SharedTable", "sorted_unique"]


@dataclass(frozen=True)
class SharedTable:
    """The memo entries some element uses but another element defines, for one file.

    ``keys[j]`` (sorted memo keys) is defined inside ``elements[element_of[j]]``, an element
    given as ``(start, end, memo_base, ext_keys)``: replaying that whole span (with its own
    externals, themselves in this table) and reading its memo yields the value.
    """

    keys: tuple[int, ...] = ()
    element_of: tuple[int, ...] = ()
    elements: tuple[tuple[int, int, int, tuple[int, ...]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "element_of": list(self.element_of),
            "elements": [[s, e, b, list(x)] for s, e, b, x in self.elements],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SharedTable:
        elements = tuple((int(s), int(e), int(b), tuple(x)) for s, e, b, x in obj["elements"])
        return cls(tuple(obj["keys"]), tuple(obj["element_of"]), elements)

    def element(self, key: int) -> int:
        """Index into ``elements`` of the element defining memo key ``key``."""
        j = bisect_left(self.keys, key)
        if j == len(self.keys) or self.keys[j] != key:
            raise KeyError(f"memo key {key} is not in the shared table")
        return self.element_of[j]


class MemoRefusal(Exception):
    """A memo reference that no element span can satisfy; ``offset`` says where."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(reason)
        self.reason, self.offset = reason, offset


_CHUNK = 1 << 15  # elements whose memo references are resolved at a time


def sorted_unique(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_index=True)`` of a 1-D integer array, by a stable sort: numpy 2's
    hash-based ``np.unique`` is 10-100x slower on the long, mostly sorted offset and key arrays
    of a scan, and its first call in a process imports ``numpy.ma`` (11 ms of a first open)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    keep = np.ones(len(xs), bool)
    np.not_equal(xs[1:], xs[:-1], out=keep[1:])
    return xs[keep], order[keep]


def _unique_pairs(first: np.ndarray, second: np.ndarray, bound: int) -> np.ndarray:
    """Sorted unique rows of ``(first, second)`` (``0 <= second < bound``), shape ``(n, 2)``."""
    if not len(first):
        return np.zeros((0, 2), np.int64)
    bound = max(bound, 1)
    if int(first.max()) < (1 << 62) // bound:  # one int64 per pair: a 1-D unique, 10x faster
        flat = sorted_unique(first.astype(np.int64) * bound + second)[0]
        return np.stack([flat // bound, flat % bound], axis=1)
    return np.unique(np.stack([first, second], axis=1), axis=0)


class ElementTable:
    """Disjoint element spans of a file and the memo keys each needs from before its start.

    Built from sorted ``starts`` / ``ends``, the file's memo definition offsets ``defs`` (by
    key) and its GET opcodes (``get_offs``, ``get_keys``). ``base[e]`` is the number of memo
    definitions before ``starts[e]``; element ``e``'s externals are
    ``ext_keys[ext_offsets[e]:ext_offsets[e + 1]]`` (sorted, unique). Raises
    :class:`MemoRefusal` when spans overlap or an external is defined outside every element.
    """

    def __init__(
        self,
        starts: np.ndarray,
        ends: np.ndarray,
        defs: np.ndarray,
        get_offs: np.ndarray,
        get_keys: np.ndarray,
    ) -> None:
        if len(starts) > 1 and (ends[:-1] > starts[1:]).any():
            bad = int(np.flatnonzero(ends[:-1] > starts[1:])[0])
            raise MemoRefusal(
                "one element's bytes lie inside another's (a field aliasing another field's items)",
                int(starts[bad + 1]),
            )
        self.starts, self.ends, self.defs = starts, ends, defs
        self.base = np.searchsorted(defs, starts, "left").astype(np.int64)
        counts = np.zeros(len(starts), np.int64)
        parts = []
        # GETs come in file order: taken _CHUNK elements at a time, each chunk's sorted unique
        # (element, key) pairs follow the last chunk's, and temporaries stay chunk-sized
        cuts = np.searchsorted(get_offs, starts[_CHUNK::_CHUNK]).tolist()
        for k, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, len(get_offs)], strict=True)):
            first, last = k * _CHUNK, min((k + 1) * _CHUNK, len(starts))
            e = self.locate(get_offs[lo:hi])
            inside = e >= 0
            e, keys = e[inside], get_keys[lo:hi][inside]
            external = defs[keys] < starts[e]
            pairs = _unique_pairs(e[external], keys[external], len(defs))
            counts[first:last] += np.bincount(pairs[:, 0] - first, minlength=last - first)
            parts.append(pairs[:, 1].astype(np.int64))
            del e, inside, keys, external, pairs
        self.ext_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.ext_keys = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        del parts, counts
        used = np.zeros(len(defs), bool)  # keys index defs: a mask beats sorting them all
        used[self.ext_keys] = True
        self.shared_keys = np.flatnonzero(used).astype(np.int64)
        del used
        self.definer = self.locate(defs[self.shared_keys])
        if (self.definer < 0).any():
            key = int(self.shared_keys[np.flatnonzero(self.definer < 0)[0]])
            raise MemoRefusal(
                f"an element refers to memo key {key}, which is defined outside every sample (a reference to the dataset's own containers)",
                int(defs[key]),
            )

    def locate(self, offsets: np.ndarray) -> np.ndarray:
        """Index of the element containing each offset, or -1."""
        e = np.searchsorted(self.starts, offsets, "right") - 1
        ok = e >= 0
        ok[ok] = offsets[ok] < self.ends[e[ok]]
        return np.where(ok, e, -1)

    def externals(self, e: int) -> np.ndarray:
        return self.ext_keys[self.ext_offsets[e] : self.ext_offsets[e + 1]]

    def shared(self) -> SharedTable:
        used = sorted_unique(self.definer)[0]  # not np.unique: see sorted_unique
        index = {int(d): j for j, d in enumerate(used)}
        elements = tuple(
            (
                int(self.starts[d]),
                int(self.ends[d]),
                int(self.base[d]),
                tuple(int(k) for k in self.externals(int(d))),
            )
            for d in used
        )
        return SharedTable(
            tuple(int(k) for k in self.shared_keys),
            tuple(index[int(d)] for d in self.definer),
            elements,
        )
