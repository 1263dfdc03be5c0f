"""The errors of span reads: one place that words a changed file, a damaged span, and names
the sample a refusal happened in (the sample label is an argument of every read, never state
on a shared lookup object)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from ..errors import (
    CorruptPickleError,
    FileChangedError,
    MemoIdError,
    PickleshardError,
    ReadMemoryError,
    RemoteStorageError,
    TruncatedPickleError,
    UnsafePickleError,
    _where,
)
from ..picklekit.unpicklers import MemoIdPastSpan
from ..producers.python2 import is_python2_str, python2_error
from ..safety.policy import guard_misuse

__all__ = ["changed", "damaged", "named", "past_span"]


def changed(
    path: str, what: str, offset: int | None, samples: Sequence[int] | None
) -> FileChangedError:
    """The error for a file found changed while reading ``samples`` (labels; one is named as
    the error's sample, several are listed in its text)."""
    if samples is not None and len(samples) > 1:
        shown = ", ".join(map(str, samples[:8])) + (" ..." if len(samples) > 8 else "")
        what = f"{what} (after reading samples {shown})"
    sample = samples[0] if samples is not None and len(samples) == 1 else None
    return FileChangedError(path, what, offset=offset, sample=sample)


def damaged(path: str, start: int, exc: Exception) -> PickleshardError:
    """The error for the span at ``start`` whose unpickling raised ``exc`` (not one of ours)."""
    misuse = guard_misuse(exc, path, start)
    if misuse is not None:
        return misuse
    if isinstance(exc, UnicodeDecodeError) and is_python2_str(exc):  # not damage
        return python2_error(path, exc, exc.encoding, offset=start)
    if isinstance(exc, MemoryError):  # not a sign of damage: say what happened
        detail = str(exc) or "MemoryError"
        return ReadMemoryError(path, f"out of memory reading this span: {detail}", offset=start)
    if isinstance(exc, EOFError) or "truncated" in str(exc):
        return TruncatedPickleError(
            path, f"span ends early (file changed since the scan?): {exc}", offset=start
        )
    return CorruptPickleError(
        path,
        f"span does not unpickle (file changed since the scan?): {type(exc).__name__}: {exc}",
        offset=start,
    )


def past_span(path: str, exc: MemoIdPastSpan, label: int | None, what: str | None) -> Exception:
    """The error for a span whose memo id ``exc`` points past it, read for sample ``label``:
    the file changed (``what`` of its identity differs: None when nothing does or it is not
    known), else a file or index that does not match (crafted)."""
    if what is not None:
        return changed(path, what, exc.offset, None if label is None else [label])
    return MemoIdError(
        path,
        f"{exc}: the data file does not match its index (a crafted file or index)",
        offset=exc.offset,
        sample=label,
    )


def named(exc: PickleshardError, label: int | None) -> PickleshardError:
    """``exc`` naming sample ``label`` when it is an allowlist refusal or a failed remote read
    that names no sample yet (raised by code that knows the file, not which sample is being
    read); else ``exc``."""
    named_here = (UnsafePickleError, RemoteStorageError)
    if label is None or not isinstance(exc, named_here) or exc.sample is not None:
        return exc
    text = str(exc.args[0]) if exc.args else ""
    before = _where(exc.path, exc.offset, None)
    if not exc.path or not text.startswith(before):
        return exc
    out = copy.copy(exc)
    out.sample = label
    out.args = (_where(exc.path, exc.offset, label) + text[len(before) :], *exc.args[1:])
    return out
