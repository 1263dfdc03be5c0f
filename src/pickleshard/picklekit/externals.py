"""External memo references: a span's ``GET`` of an id that an earlier element defined.

A sample's span may refer to memo ids created outside it (a global, a dtype, a repeated string).
Its value is what the id holds after the *whole* element that defines it has been unpickled
(numpy's dtype gets a ``BUILD`` after its ``MEMOIZE``), so resolving one means replaying that
element once and keeping its memo. Every reader of spans (the scanner's inspector, the span
reader, ``inspect``'s preview) resolves externals with :class:`ExternalMemos` and maps a file
offset to its pickle's memo shift with :class:`MemoShifts`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ExternalMemos", "MemoShifts", "UnresolvableMemoId"]


class UnresolvableMemoId(LookupError):
    """A memo id no earlier element defines, or one whose element refers to itself."""


class MemoShifts:
    """The memo-id shift of the pickle each offset lies in.

    A file of appended pickles restarts memo ids at 0 in each; the index numbers them on from
    the previous pickle's, so an id read in pickle ``r`` is ``local id + shift[r]``. ``starts``
    are the pickles' first offsets (ascending), ``shifts`` their shifts.
    """

    def __init__(self, starts: np.ndarray, shifts: np.ndarray) -> None:
        self.starts = np.ascontiguousarray(starts, np.int64)
        self.shifts = np.ascontiguousarray(shifts, np.int64)
        self.single: int | None = int(self.shifts[0]) if len(self.shifts) == 1 else None

    @classmethod
    def of_records(cls, records: Any) -> MemoShifts:
        """From an index's ``records`` table: rows ``(start, end, shift)``, or a list of them."""
        rows = np.asarray(records, np.int64).reshape(-1, 3)
        if len(rows) == 0:
            rows = np.zeros((1, 3), np.int64)
        return cls(rows[:, 0], rows[:, 2])

    def at(self, offset: int) -> int:
        """The shift of the pickle that holds ``offset``."""
        if self.single is not None:
            return self.single
        row = int(np.searchsorted(self.starts, offset, "right")) - 1
        return int(self.shifts[max(row, 0)])


class ExternalMemos:
    """Resolves external memo ids by replaying, once each, the element that defines them.

    ``element_of(key)`` is the element that defines memo id ``key`` (negative: none does);
    ``replay(e)`` unpickles element ``e`` and returns its memo as ``{global id: value}``
    (it may itself resolve externals through this object). Every replayed memo is kept in
    :attr:`memos` (one per element: the caller bounds the element count, e.g. a file's
    shared-element table); a key whose element is being replayed when it is asked for (an
    element that refers to itself) raises :class:`UnresolvableMemoId`, never recursion.
    """

    def __init__(
        self, element_of: Callable[[int], int], replay: Callable[[int], dict[int, Any]]
    ) -> None:
        self.element_of = element_of
        self.replay = replay
        self.memos: dict[int, dict[int, Any] | None] = {}
        self.replays = 0

    def __call__(self, key: int) -> Any:
        e = self.element_of(key)
        if e < 0:
            raise UnresolvableMemoId(f"memo id {key} is not defined by an element before its use")
        memo = self.memos.get(e)
        if memo is None:
            if e in self.memos:
                raise UnresolvableMemoId(f"memo id {key} refers to its own element")
            self.memos[e] = None  # replaying: a self-reference meets this marker
            try:
                memo = self.replay(e)
            except BaseException:
                del self.memos[e]
                raise
            self.memos[e] = memo
            self.replays += 1
        try:
            return memo[key]
        except KeyError:
            raise UnresolvableMemoId(
                f"memo id {key} is not defined by the element said to define it"
            ) from None

    def clear(self) -> None:
        self.memos.clear()
