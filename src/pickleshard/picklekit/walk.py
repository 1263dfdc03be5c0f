"""Walk every pickle of a file with the walker an engine names: the scanner's entry point.

:func:`walk_opcodes` walks the pickles of a buffer one after another with the compiled walker
(``pickleshard._cscan.walk_record``) or its pure-Python reference
(:func:`pickleshard.picklekit.walker.walk_record`), as :func:`resolve_engine` picks, and turns
what makes a file readable only as a whole into :class:`~pickleshard.errors.NotSpanIndexableError`.
"""

from __future__ import annotations

import functools
import mmap
from array import array
from collections.abc import Callable
from typing import Any, Final

from ..errors import (
    CorruptPickleError,
    EmptyPickleError,
    NotAPickleError,
    NotSpanIndexableError,
    TruncatedPickleError,
)
from .compiled import CORE
from .gcpause import paused_gc
from .nodes import Value
from .opcodes import HIGHEST_PROTOCOL, PROTO_OP
from .walker import Refused, Release, Unsupported, Walked, walk_record

__all__ = ["ENGINES", "compiled_walker", "releaser", "resolve_engine", "walk_opcodes"]

KEEP_MAPPED: Final = 64 << 20  # files up to this size keep their pages mapped during a scan
ENGINES: Final = ("auto", "compiled", "python")
WalkRecord = Callable[[Any, int, int, Walked, Release | None], tuple[Value, int, int]]


@functools.cache
def compiled_walker() -> WalkRecord | None:
    """The compiled twin of :func:`~pickleshard.picklekit.walker.walk_record`
    (``pickleshard._cscan``), or None if it is not built."""
    return CORE.walk_record if CORE is not None else None


def resolve_engine(engine: str) -> str:
    """``"compiled"`` or ``"python"``: the walker that ``engine`` (one of :data:`ENGINES`) means.

    ``"auto"`` is the compiled walker when the extension is built, else the pure-Python one;
    ``"compiled"`` raises ``ImportError`` when the extension is not built.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    if engine == "python":
        return engine
    if compiled_walker() is None:
        if engine == "compiled":
            raise ImportError(
                "the compiled scanner pickleshard._cscan is not built (pip install -e . builds it)"
            )
        return "python"
    return "compiled"


def _walk_with(
    walk: WalkRecord, buf: Any, pos: int, end: int, w: Walked, release: Release | None
) -> tuple[Value, int, int]:
    n_defs, n_gets = len(w.defs), len(w.get_offs)
    try:
        return walk(buf, pos, end, w, release)
    except Unsupported:  # the compiled walker leaves this pickle to the reference
        del w.defs[n_defs:], w.get_offs[n_gets:], w.get_keys[n_gets:]
        return walk_record(buf, pos, end, w, release)


def releaser(buf: Any) -> Release | None:
    """For an mmap: drop its pages before an offset from this process's page tables (they stay
    in the page cache). A walk never reads back, and the kernel maps 64 KiB around every page
    fault: without this, walking a file of big payloads maps a tenth of it or more."""
    if not isinstance(buf, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    if len(buf) <= KEEP_MAPPED:
        return None  # small: its pages stay mapped until the scan unmaps the file
    done = [0]

    def release(upto: int) -> None:
        upto -= upto % mmap.PAGESIZE
        if upto > done[0]:
            buf.madvise(mmap.MADV_DONTNEED, done[0], upto - done[0])
            done[0] = upto

    return release


def walk_opcodes(
    buf: Any, size: int, name: str, *, engine: str = "auto", release: bool = True
) -> Walked:
    """Walk every pickle of ``buf[:size]`` (bytes or mmap), one after another.

    ``engine`` picks the walker (:func:`resolve_engine`); both give equal results and raise the
    same exceptions at the same offsets, and ``Walked.engine`` says which one ran. Pages of an
    mmap ``buf`` the walk has passed are unmapped as it goes (:func:`releaser`). Raises
    :class:`EmptyPickleError`, :class:`NotAPickleError`, :class:`TruncatedPickleError` or
    :class:`CorruptPickleError` for bad bytes in the first pickle, and
    :class:`NotSpanIndexableError` for anything readable only as a whole (including bytes after
    the first pickle that are not a complete protocol 2+ pickle). ``release=False`` keeps the
    pages mapped until the caller unmaps ``buf`` (a randomly advised map: only pages touched).
    """
    if size == 0:
        raise EmptyPickleError(name, "file is empty; expected a pickle stream", offset=0)
    if size == 1 and buf[0] == PROTO_OP:
        raise TruncatedPickleError(name, "stream ends inside the PROTO opcode", offset=0)
    engine = resolve_engine(engine)
    walk = compiled_walker() if engine == "compiled" else walk_record
    assert walk is not None
    w = Walked(name, size, 0, [], [], array("q"), array("q"), array("q"), 0, engine)
    drop = releaser(buf) if release else None
    pos = 0
    while pos < size:
        first = not w.records
        proto = buf[pos + 1] if buf[pos] == PROTO_OP and pos + 1 < size else -1
        if first and proto > HIGHEST_PROTOCOL:
            raise NotAPickleError(name, f"PROTO opcode names unknown protocol {proto}", offset=1)
        if not 2 <= proto <= HIGHEST_PROTOCOL or (not first and proto != w.protocol):
            why = "no PROTO 2+ opcode at byte 0: a protocol 0 or 1 pickle, or not a pickle"
            if not first:
                why = f"bytes after pickle #{len(w.records)} are not a protocol {w.protocol} pickle"
            raise NotSpanIndexableError(name, why, offset=pos)
        key0 = len(w.defs)
        try:  # the walk makes no cycles; GC passes over its lists cost half its time
            with paused_gc():
                root, nxt, first_id = _walk_with(walk, buf, pos + 2, size, w, drop)
        except Refused as exc:
            raise NotSpanIndexableError(name, exc.reason, offset=exc.offset) from None
        except CorruptPickleError as exc:
            if first:
                raise
            why = f"pickle #{len(w.records) + 1} is damaged: {exc}"
            raise NotSpanIndexableError(name, why, offset=pos) from None
        w.protocol = proto
        w.roots.append(root)
        w.records.append((pos, nxt, key0 - first_id))
        pos = nxt
    return w
