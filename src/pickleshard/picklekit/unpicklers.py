"""Unpickling one span of a pickle with the memo entries it needs: the always-correct general path.

A span (see :mod:`pickleshard.picklekit.spanfile`) read alone has ``MEMOIZE`` opcodes that must
number from the memo id the whole-file unpickler would have reached at its start (its *first
id*), and ``GET`` opcodes that may name ids defined before it (*external* ids).
:class:`SpanUnpickler` reads it through a :class:`~pickleshard.picklekit.spanfile.SpanFile`,
counts ``MEMOIZE`` from the first id, ignores ``FRAME`` headers (a span may start or end inside
a frame), and asks a ``resolve`` callable for every external id (an
:class:`~pickleshard.picklekit.externals.ExternalMemos`, typically). It is ``pickle._Unpickler``
(pure Python) underneath, so it is slow and obviously right: the oracle for the fast path in
:mod:`pickleshard.spanread`. The inert variant that runs no code is
:class:`pickleshard.safety.inert.InspectUnpickler`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, ClassVar

from .opcodes import FRAME_OP, MEMOIZE_OP, OPNAME, U4
from .spanfile import SpanFile

__all__ = ["FindClass", "MemoIdPastSpan", "Resolve", "ResolvingMemo", "SpanUnpickler"]

Resolve = Callable[[int], Any]
FindClass = Callable[[str, str], Any]


class MemoIdPastSpan(pickle.UnpicklingError):
    """A span's ``PUT``/``GET`` names a memo id its own bytes cannot have defined: the span's ids
    run on densely from its memo base, one per defining opcode (``MEMOIZE``, ``PUT``: at least one
    byte each), so a span of ``L`` bytes defines at most ``L`` of them. Refused before the C
    unpickler sees it, which would grow its memo to the id (up to 2**32 entries, 32 GB).
    ``offset`` is the opcode's file offset; :mod:`pickleshard.spanread` turns this into
    :class:`~pickleshard.errors.MemoIdError` naming the file and sample."""

    def __init__(self, op: int, offset: int, ident: int, start: int, end: int) -> None:
        self.offset = offset
        super().__init__(
            f"{OPNAME[op]} at byte {offset} names memo id {ident}, past the ids the span "
            f"[{start}, {end}) can define ({end - start} at most from its memo base)"
        )


class ResolvingMemo(dict[int, Any]):
    """A memo dict whose missing ids are asked of ``resolve`` (and then kept)."""

    def __init__(self, resolve: Resolve) -> None:
        super().__init__()
        self._resolve = resolve

    def __missing__(self, memo_id: int) -> Any:
        value = self._resolve(memo_id)
        self[memo_id] = value
        return value


class SpanUnpickler(pickle._Unpickler):
    """``pickle._Unpickler`` for one span read through a :class:`SpanFile`.

    ``MEMOIZE`` stores at ``first_id``, ``first_id + 1``...; ``PUT`` stores at its explicit id,
    and a later ``MEMOIZE`` goes on from the id after it;
    a ``GET`` of an id not stored yet calls ``resolve(id)`` (ids are the file's own, record-local
    ids). ``FRAME`` headers are skipped. After :meth:`load`, ``memo`` holds every id the span
    defined plus the externals it used. ``find_class``, if given, replaces the module lookup.
    """

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)
    # set by pickle._Unpickler, which typeshed does not describe
    stack: list[Any]
    read: Callable[[int], bytes]
    readline: Callable[[], bytes]
    append: Callable[[Any], None]
    _decode_string: Callable[[bytes], Any]

    def __init__(
        self,
        file: SpanFile,
        *,
        first_id: int,
        resolve: Resolve,
        encoding: str = "ASCII",
        errors: str = "strict",
        find_class: FindClass | None = None,
    ) -> None:
        super().__init__(file, encoding=encoding, errors=errors)
        self.span = file
        self.memo: ResolvingMemo = ResolvingMemo(resolve)
        self._next_id = first_id
        self._id_limit = first_id + file.end - file.start  # see MemoIdPastSpan
        self._find_class_hook = find_class

    def find_class(self, module: str, name: str) -> Any:
        if self._find_class_hook is not None:
            return self._find_class_hook(module, name)
        return super().find_class(module, name)

    def load_memoize(self) -> None:
        self.memo[self._next_id] = self.stack[-1]
        self._next_id += 1

    def _put(self, memo_id: int, op: int, offset: int) -> None:
        """``PUT`` (opcode ``op`` at file ``offset``) of ``memo_id``."""
        if memo_id < 0:
            raise ValueError("negative PUT argument")
        if memo_id >= self._id_limit:  # as the fast path refuses it (no reader's paths differ)
            raise MemoIdPastSpan(op, offset, memo_id, self.span.start, self.span.end)
        self.memo[memo_id] = self.stack[-1]
        # The scanner admits only ids stored in order, so a MEMOIZE after this PUT (as C's
        # unpickler counts, len(memo)) stores at the next id.
        self._next_id = memo_id + 1

    def load_put(self) -> None:
        at = self.span.offset - 1  # the opcode's, read already
        self._put(int(self.readline()[:-1]), pickle.PUT[0], at)

    def load_binput(self) -> None:
        at = self.span.offset - 1
        self._put(self.read(1)[0], pickle.BINPUT[0], at)

    def load_long_binput(self) -> None:
        at = self.span.offset - 1
        self._put(U4(self.read(4))[0], pickle.LONG_BINPUT[0], at)

    def load_frame(self) -> None:
        self.read(8)

    dispatch[MEMOIZE_OP] = load_memoize
    dispatch[pickle.PUT[0]] = load_put
    dispatch[pickle.BINPUT[0]] = load_binput
    dispatch[pickle.LONG_BINPUT[0]] = load_long_binput
    dispatch[FRAME_OP] = load_frame
