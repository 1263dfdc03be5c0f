"""How one file's samples are read: the per-field strategies and the immutable :class:`ReadPlan`.

A file's fields are each read one way (:data:`SPAN`, :data:`ROW`, :data:`ITEM`, :data:`INT`).
Which way is settled once per file and process, by the first read (an
:class:`~pickleshard.scan.ArrayItem` field is checked against a real unpickling of one of its
samples, an int field's values are decoded), and frozen in a :class:`ReadPlan`; every later read
executes the plan, with no decision left in the hot loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["INT", "ITEM", "ROW", "SPAN", "FieldReader", "ReadPlan", "ReaderStats"]

SPAN, ROW, ITEM, INT = range(4)  # how a field is read (the compiled loader's H_* values)


@dataclass
class ReaderStats:
    """Counters of a :class:`~pickleshard.read.SpanReader` (per process); its cache of shared
    values counts in its own :class:`~pickleshard.io.lru.CacheStats` (``spans.shared.stats``)."""

    fast_reads: int = 0
    general_reads: int = 0
    array_rows: int = 0
    array_items: int = 0  # samples of per-sample array fields read straight from their payload
    int_items: int = 0  # small ints decoded without an unpickler
    replays: int = 0
    bytes_read: int = 0


class FieldReader(Protocol):
    """One field's strategy other than by span: ``one`` reads sample ``i`` (its span
    ``[start, end)``), ``many`` the samples ``idx`` (in offset order) into a list (with the compiled ``loader``
    when it has a faster way); errors name
    ``label`` / ``labels[k]``."""

    def one(self, i: int, start: int, end: int, label: int) -> Any: ...

    def many(self, idx: list[int], labels: list[int], loader: Any = None) -> list[Any]: ...


@dataclass(frozen=True)
class ReadPlan:
    """How every field of one file is read in this process (decided once, see the module).

    ``hows[f]`` is the field's strategy; ``readers[f]`` its reader (None for :data:`SPAN`:
    the span reader of the file serves every such field). ``compiled``: the compiled loader
    holds this plan, so a whole sample is one compiled call (its fields are at most one span,
    small ints with decoded values and arrays read from their payloads); ``span_field`` is then
    the one field read by span (-1: none).
    """

    hows: tuple[int, ...]
    readers: tuple[FieldReader | None, ...]
    compiled: bool = False
    span_field: int = -1

    @property
    def spans(self) -> tuple[int, ...]:
        """The fields read by span."""
        return tuple(f for f, how in enumerate(self.hows) if how == SPAN)

    @property
    def by_field(self) -> bool:
        """Whether a batch is read field by field (arrays of one field into one block, ints from
        their decoded values); else sample by sample (a compiled plan without arrays: one
        compiled call for the whole batch)."""
        return not self.compiled or ITEM in self.hows
