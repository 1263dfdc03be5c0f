"""Evaluating spans without running code: the :class:`Inspector` the scanner asks for dict keys,
top-level fields that are not containers, and array templates.

It unpickles a span with :class:`~pickleshard.safety.inert.InspectUnpickler` (payloads skipped, no
global imported), resolving memo ids defined outside the span by replaying, once each, the
element that defines them. Anything it cannot evaluate is :data:`UNKNOWN`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptPickleError, NotSpanIndexableError
from ..io.handles import WeakMethod
from ..picklekit import opcodes as oc
from ..picklekit.compiled import require
from ..picklekit.externals import ExternalMemos, MemoShifts
from ..picklekit.hashalike import AlikeInts, hash_flood_message
from ..picklekit.memotables import ElementTable
from ..picklekit.spanfile import WINDOW, SpanFile
from ..picklekit.walk import releaser
from ..picklekit.walker import Walked
from ..safety.inert import InspectUnpickler
from .fastpath import TemplateCheck, gathered, template_matches_py

__all__ = ["UNKNOWN", "Inspector"]

UNKNOWN = object()  # what a span evaluates to when the inspector cannot tell


class Inspector:
    """Evaluates spans with :class:`InspectUnpickler` (no code run, payloads skipped).

    The memo of every element replayed to resolve an external is kept (by
    :class:`~pickleshard.picklekit.externals.ExternalMemos`), so each is read once; an element
    whose replay failed is not replayed again (its ids are unresolvable).
    """

    def __init__(
        self, buf: Any, w: Walked, table: ElementTable, encoding: str, release: bool = True
    ) -> None:
        self.buf, self.w, self.table, self.encoding = buf, w, table, encoding
        self.release = release  # drop the pages behind each gather (see scan.access.scan_view)
        self.shifts = MemoShifts.of_records(w.records)
        self.failed: set[int] = set()  # elements whose replay failed: not tried again
        # callbacks that hold the inspector weakly (io.handles.WeakMethod): bound methods made
        # a cycle that kept every file's inspector (its walk, tables and buffer) alive until a
        # collection freed them
        self.externals = ExternalMemos(WeakMethod(self, "_element_of"), WeakMethod(self, "_replay"))
        self.consts: dict[int, str] = {}
        self.bytes_read = 0
        self.window = WINDOW  # bytes per read of a span
        self.alike = AlikeInts()  # one count for the file: its keys are evaluated one by one

    def _read_at(self, offset: int, n: int) -> bytes:
        return bytes(self.buf[offset : offset + n])

    def gather(self, at: np.ndarray, rel: np.ndarray) -> np.ndarray:
        """:func:`~pickleshard.scan.fastpath.gathered` of this file, by the walk's engine."""
        if self.w.engine == "compiled":
            at, rel = at.astype(np.int64, copy=False), rel.astype(np.int64, copy=False)
            drop = releaser(self.buf) if self.release else None
            return require().gather(self.buf, at, rel, drop)  # type: ignore[no-any-return]
        return gathered(self.buf, at, rel, self.release)

    def matches(self, c: TemplateCheck, cand: np.ndarray) -> np.ndarray:
        """:func:`~pickleshard.scan.fastpath.template_matches_py` of this file's samples
        ``cand``, by the walk's engine (compiled: one pass, no gathered copies)."""
        if self.w.engine == "compiled":
            drop = releaser(self.buf) if self.release else None
            return require().template_matches(  # type: ignore[no-any-return]
                self.buf,
                c.st.astype(np.int64, copy=False),
                c.lengths.astype(np.int64, copy=False),
                cand.astype(np.int64, copy=False),
                c.length,
                c.rel.astype(np.int64, copy=False),
                c.template.astype(np.uint8, copy=False),
                c.mask.astype(np.uint8),
                c.ats.astype(np.int64, copy=False),
                drop,
            )
        return template_matches_py(self.gather, c, cand)

    def load(self, start: int, end: int, bytes_min: int = 0) -> tuple[Any, dict[int, Any]]:
        shift = self.shifts.at(start)
        first = int(np.searchsorted(self.table.defs, start)) - shift
        span = SpanFile(self._read_at, start, end, self.w.protocol, window=self.window)
        u = InspectUnpickler(
            span,
            bytes_min=bytes_min,
            first_id=first,
            resolve=lambda i: self.externals(i + shift),
            encoding=self.encoding,
            alike=self.alike,
        )
        try:
            value = u.load()
        finally:
            self.bytes_read += span.bytes_read
        return value, {i + shift: v for i, v in u.memo.items()}

    def _element_of(self, key: int) -> int:
        e = int(self.table.locate(self.table.defs[key : key + 1])[0])
        return -1 if e in self.failed else e

    def _replay(self, e: int) -> dict[int, Any]:
        try:
            return self.load(int(self.table.starts[e]), int(self.table.ends[e]))[1]
        except BaseException:
            self.failed.add(e)
            raise

    def value(self, start: int, end: int, bytes_min: int = 0) -> Any:
        try:
            return self.load(start, end, bytes_min)[0]
        except Exception:  # anything the inspector cannot evaluate is of unknown type
            if self.alike.over:  # but a file whose ints hash alike is not scanned on
                reason = hash_flood_message(self.alike.over)
                raise NotSpanIndexableError(self.w.name, reason, offset=start) from None
            return UNKNOWN

    def key(self, start: int, end: int) -> Any:
        """A dict key's value; short strings and GETs of them are decoded without an unpickler."""
        buf, op = self.buf, self.buf[start]
        if op in (oc.SHORT_BINUNICODE_OP, oc.BINUNICODE_OP):
            hdr = 2 if op == oc.SHORT_BINUNICODE_OP else 5
            stop = start + hdr + (buf[start + 1] if hdr == 2 else oc.U4(buf, start + 1)[0])
            tail = end - stop
            if tail == 0 or (tail in MEMO_TAIL and buf[stop] == MEMO_TAIL[tail]):
                try:
                    value = str(buf[start + hdr : stop], "utf-8", "surrogatepass")
                except UnicodeDecodeError as exc:
                    raise CorruptPickleError(
                        self.w.name, f"a dict key is not UTF-8 text: {exc}", offset=start
                    ) from None
                self.consts[stop] = value
                return value
        if (op == oc.BINGET_OP and end - start == 2) or (
            op == oc.LONG_BINGET_OP and end - start == 5
        ):
            mid = buf[start + 1] if op == oc.BINGET_OP else oc.U4(buf, start + 1)[0]
            known = self.consts.get(int(self.table.defs[mid + self.shifts.at(start)]))
            if known is not None:
                return known
        return self.value(start, end, bytes_min=4096)


# the memo opcode a dict key's span may end with, by its length
MEMO_TAIL = {1: oc.MEMOIZE_OP, 2: oc.BINPUT_OP, 5: oc.LONG_BINPUT_OP}
