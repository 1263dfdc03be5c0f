"""What differs between an output value and its source value, in words: the first place they
part (a nested item, an array element) and the two values there, never two summaries that read
alike ("got ndarray float32 (3, 64, 64), expected ndarray float32 (3, 64, 64)")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["difference"]

_SHOWN = 60  # characters of a value's repr shown


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _arrays(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> str | None:
    if got.dtype != want.dtype:
        return f"dtype {got.dtype.str} ({got.dtype}), expected {want.dtype.str} ({want.dtype})"
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype.hasobject:
        for at in np.ndindex(got.shape):
            inner = difference(got[at], want[at])
            if inner is not None:
                return f"element {list(at)}: {inner}"
        return None
    equal_nan = got.dtype.kind in "fc"
    same = got == want if not equal_nan else np.isclose(got, want, rtol=0, atol=0, equal_nan=True)
    wrong = np.argwhere(~np.asarray(same))
    if len(wrong) == 0:
        # equal by value but not by bytes: the sign of a zero, a NaN's payload, padding
        diff = np.argwhere(
            got.reshape(-1).view(np.uint8).reshape(got.size, -1)
            != want.reshape(-1).view(np.uint8).reshape(want.size, -1)
        )
        if len(diff) == 0:
            return None
        at = np.unravel_index(int(diff[0][0]), got.shape) if got.ndim else ()
        where = [int(i) for i in at]
        return (
            f"values compare equal but their bytes differ (first at element {where}: "
            f"{got[at]!r} vs {want[at]!r}; a zero's sign or a NaN's payload)"
        )
    first = tuple(int(i) for i in wrong[0])
    return (
        f"{len(wrong):,} of {got.size:,} elements differ; the first at {list(first)}: "
        f"{got[first]!r}, expected {want[first]!r}"
    )


def difference(got: Any, want: Any) -> str | None:
    """Where ``got`` first differs from ``want`` and how, or None when nothing is found (the
    caller knows they differ by digest: then their types' bytes, not their values, do)."""
    if type(got) is not type(want):
        return f"{type(got).__name__} {_short(got)}, expected {type(want).__name__} {_short(want)}"
    if isinstance(want, np.ndarray):
        return _arrays(got, want)
    if isinstance(want, Mapping):
        if list(got) != list(want):
            return f"keys {_short(list(got))}, expected {_short(list(want))}"
        for k in want:
            inner = difference(got[k], want[k])
            if inner is not None:
                return f"[{k!r}]: {inner}"
        return None
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{len(got)} items, expected {len(want)}"
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            inner = difference(g, w)
            if inner is not None:
                return f"[{k}]: {inner}"
        return None
    if isinstance(want, np.generic) and got.dtype != want.dtype:
        return f"{got!r} ({got.dtype}), expected {want!r} ({want.dtype})"
    try:
        same = bool(got == want)
    except Exception:  # a type whose == raises or is ambiguous: compare the text
        same = repr(got) == repr(want)
    return None if same else f"{_short(got)}, expected {_short(want)}"
