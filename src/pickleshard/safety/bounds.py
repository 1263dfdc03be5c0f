"""Per-sample bounds: decoded size and nesting depth, checked where a sample is handed out.

The allowlist's guards (:mod:`pickleshard.safety.guards`) stop a few bytes from becoming a large object
during the load; these bounds stop what the guards cannot see: a sample whose tree is too big to
collate, convert or send between processes (a list of a million references to one array is a
few MB in memory but a terabyte once collated), or nested so deep that pickling it again (a
DataLoader worker sends it to the main process), collating or converting it ends in a
``RecursionError``, or in a worker that dies and a DataLoader that waits for it forever.

:func:`measure` walks a sample iteratively, never recursing: each distinct container once (a
shared one contributes its memoized size and height again wherever it is referenced), arrays,
tensors, scalars, strings and bytes as leaves of their byte size, plus 8 bytes per reference. It
stops as soon as a bound is passed, so a hostile sample costs at most ``max_depth`` frames and
the work to exceed ``max_bytes``. A sample that contains itself is refused as too deep.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import BoundExceeded, SampleTooDeepError, SampleTooLargeError
from ..picklekit.compiled import CORE

__all__ = ["DEFAULT_MAX_DEPTH", "DEFAULT_MAX_SAMPLE_BYTES", "check_sample", "measure"]

DEFAULT_MAX_SAMPLE_BYTES = 2 << 30
"""2 GiB. The design's machine has 16-64 GB of RAM, and a DataLoader with 4 workers and the
default prefetch holds about 8 samples in flight, twice over once a batch is collated: 16
samples of 2 GiB are 32 GiB, the most such a machine sustains. A larger sample is an attack, a
damaged file or a dataset that needs ``max_sample_bytes=None``."""
DEFAULT_MAX_DEPTH = 100
"""Levels of nested containers. Training samples nest a handful of levels; Python's recursion
limit is 1000 frames and collating or pickling spends two or more frames per level."""

_REF = 8  # bytes per reference a container holds (a pointer)
_FIXED: dict[type, int] = {
    float: _REF,
    bool: _REF,
    type(None): _REF,
    complex: 2 * _REF,
    range: 6 * _REF,
    slice: 3 * _REF,
}
_TEXT = (str, bytes, bytearray)
_CONTAINERS = (list, tuple, set, frozenset, dict)
_OPAQUE = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)
_NO_BOUND = 1 << 62


_SMALL_INT = 1 << 63


def _leaf(v: Any, _ndarray: type = np.ndarray, _fixed: dict[type, int] = _FIXED) -> int:
    """The byte size of ``v`` if it is a leaf, else -1 (a container to walk)."""
    t = type(v)
    if t is _ndarray:
        return -1 if v.dtype.hasobject else v.nbytes
    if t is int:
        return _REF if -_SMALL_INT <= v < _SMALL_INT else v.bit_length() >> 3
    if t is str or t is bytes:
        return len(v)
    fixed = _fixed.get(t)
    if fixed is not None:
        return fixed
    if t is list or t is tuple or t is dict:
        return -1
    return _other_leaf(v)


def _other_leaf(v: Any) -> int:
    if isinstance(v, np.generic):
        return int(v.nbytes)
    if isinstance(v, np.ndarray):  # a subclass: its object elements, if any, are walked
        return -1 if v.dtype.hasobject else int(v.nbytes)
    if isinstance(v, _CONTAINERS):
        return -1
    if isinstance(v, _TEXT):
        return len(v)
    if isinstance(v, int):
        return max(_REF, v.bit_length() >> 3)
    if isinstance(v, _OPAQUE):
        return _REF
    element_size = getattr(v, "element_size", None)  # a torch tensor, without importing torch
    if element_size is not None and hasattr(v, "nelement"):
        try:
            return int(element_size()) * int(v.nelement())
        except Exception:
            return _REF
    if hasattr(v, "__dict__"):
        return -1
    try:
        return int(sys.getsizeof(v))
    except Exception:
        return _REF


def _children(v: Any) -> tuple[Iterable[Any], int]:
    """The values a container refers to, and the bytes of its references."""
    if isinstance(v, dict):
        return itertools.chain(v, v.values()), 2 * _REF * len(v)
    if isinstance(v, (list, tuple, set, frozenset)):
        return v, _REF * len(v)
    if isinstance(v, np.ndarray):  # object dtype
        return _objects(v), _REF * v.size
    attrs = vars(v)
    return attrs.values(), _REF * len(attrs)


def _objects(v: np.ndarray) -> Iterable[Any]:
    """The objects an array with object elements holds: its elements, or, in a structured
    array, those of its object fields (its ``flat`` gives records, ``np.void`` scalars that
    would be counted as leaves, hiding what the fields refer to from the bounds)."""
    dtype = v.dtype
    if dtype.names is None:
        return v.flat
    return itertools.chain.from_iterable(  # by name: ``fields`` lists a titled field twice
        _objects(v[name]) for name in dtype.names if dtype[name].hasobject
    )


class _Walk:
    """One :func:`measure`: the bounds, the containers done (by id: their size and height, so
    a shared one is walked once) and the containers on the current path (a cycle)."""

    __slots__ = ("deepest", "done", "limit", "path")

    def __init__(self, limit: int, deepest: int) -> None:
        self.limit, self.deepest = limit, deepest
        self.done: dict[int, tuple[int, int]] = {}
        self.path: set[int] = set()

    def container(self, v: Any, depth: int) -> tuple[int, int]:
        """``(bytes, height)`` of container ``v`` at ``depth`` (1: the sample itself).
        Recursive: called only while ``depth`` stays within a bound of at most
        :data:`_RECURSE_MAX` levels (see :func:`measure`)."""
        key = id(v)
        got = self.done.get(key)
        if got is not None:
            if depth - 1 + got[1] > self.deepest:
                raise BoundExceeded("depth", depth - 1 + got[1])
            return got
        if depth > self.deepest:
            raise BoundExceeded("depth", depth)
        if key in self.path:
            raise BoundExceeded("cycle", depth)
        self.path.add(key)
        kids, total = _children(v)
        height, limit = 0, self.limit
        for child in kids:
            t = type(child)  # the common leaves inline: this loop is the cost of a check
            if t is int and -_SMALL_INT <= child < _SMALL_INT:
                total += _REF
            elif t is str:
                total += len(child)
            else:
                n = _leaf(child)
                if n < 0:
                    n, h = self.container(child, depth + 1)
                    if h > height:
                        height = h
                total += n
            if total > limit:
                raise BoundExceeded("bytes", total)
        self.path.discard(key)
        got = self.done[key] = (total, height + 1)
        return got


_RECURSE_MAX = 200  # depth bounds up to this walk by recursion (fast); deeper ones iteratively


def measure(sample: Any, max_bytes: int | None, max_depth: int | None) -> tuple[int, int]:
    """``(bytes, depth)`` of ``sample`` as a tree (see the module notes). Raises
    :class:`BoundExceeded` (internal; :func:`check_sample` names the file) past a bound: ``what``
    is ``"bytes"``, ``"depth"`` or ``"cycle"``.

    The compiled walk (``pickleshard._cscan.measure_tree``) answers when the extension is
    built, the bounds fit its C integers and the sample holds only the common types; otherwise,
    and whenever it declines, :func:`_measure_py` (the reference) does."""
    if _measure_tree is not None:
        limit = max_bytes if max_bytes is not None else _NO_BOUND
        deepest = max_depth if max_depth is not None else _NO_BOUND
        if limit <= _NO_BOUND and deepest <= _NO_BOUND:
            got = _measure_tree(sample, limit, deepest, deepest <= _RECURSE_MAX)
            if got is not _FALLBACK:
                return got  # type: ignore[no-any-return]
    return _measure_py(sample, max_bytes, max_depth)


def _measure_py(sample: Any, max_bytes: int | None, max_depth: int | None) -> tuple[int, int]:
    """:func:`measure` in Python: the reference of the compiled walk, and the walk of the
    samples it declines (sets, subclasses, tensors, numpy scalars, objects with attributes)."""
    limit = max_bytes if max_bytes is not None else _NO_BOUND
    deepest = max_depth if max_depth is not None else _NO_BOUND
    size = _leaf(sample)
    if size >= 0:
        if size > limit:
            raise BoundExceeded("bytes", size)
        return size, 0
    if deepest <= _RECURSE_MAX:
        return _Walk(limit, deepest).container(sample, 1)
    return _iterative(sample, limit, deepest)


def _iterative(sample: Any, limit: int, deepest: int) -> tuple[int, int]:
    """:meth:`_Walk.container` without recursion, for depth bounds past :data:`_RECURSE_MAX`."""
    done: dict[int, tuple[int, int]] = {}
    on_path = {id(sample)}
    kids, own = _children(sample)
    frames: list[list[Any]] = [[sample, iter(kids), own, 0]]  # object, children, bytes, height
    while True:
        frame = frames[-1]
        for child in frame[1]:
            size = _leaf(child)
            if size < 0:
                got = done.get(id(child))
                if got is None:
                    if id(child) in on_path:
                        raise BoundExceeded("cycle", len(frames))
                    if len(frames) >= deepest:
                        raise BoundExceeded("depth", len(frames) + 1)
                    on_path.add(id(child))
                    kids, own = _children(child)
                    frames.append([child, iter(kids), own, 0])
                    break
                if len(frames) + got[1] > deepest:
                    raise BoundExceeded("depth", len(frames) + got[1])
                size = got[0]
                if got[1] > frame[3]:
                    frame[3] = got[1]
            frame[2] += size
            if frame[2] > limit:
                raise BoundExceeded("bytes", frame[2])
        else:
            frames.pop()
            obj, total, height = frame[0], frame[2], frame[3] + 1
            on_path.discard(id(obj))
            if not frames:
                return total, height
            done[id(obj)] = (total, height)
            parent = frames[-1]
            parent[2] += total
            if height > parent[3]:
                parent[3] = height
            if parent[2] > limit:
                raise BoundExceeded("bytes", parent[2])


def check_sample(
    sample: Any, path: str, sample_index: int | None, max_bytes: int | None, max_depth: int | None
) -> None:
    """Raise :class:`~pickleshard.errors.SampleTooLargeError` or
    :class:`~pickleshard.errors.SampleTooDeepError` naming ``path`` and ``sample_index`` when
    ``sample`` passes ``max_bytes`` or ``max_depth`` (None: no bound).

    A tuple of leaves (the common sample: arrays and scalars) is held to the byte bound alone,
    by the sum of its leaves; any other sample is measured. The compiled test
    (``pickleshard._cscan.check_tree``, one call) decides when it can; else this module does."""
    try:
        if _check_tree is not None:
            limit = max_bytes if max_bytes is not None else _NO_BOUND
            deepest = max_depth if max_depth is not None else _NO_BOUND
            fits = limit <= _NO_BOUND and deepest <= _NO_BOUND  # C integers hold them
            if fits and _check_tree(sample, limit, deepest, deepest <= _RECURSE_MAX) is None:
                return
        if type(sample) is tuple:
            total = _leaf_total_py(sample)
            if total >= 0:
                if max_bytes is not None and total > max_bytes:
                    raise BoundExceeded("bytes", total)
                return
        _measure_py(sample, max_bytes, max_depth)
    except BoundExceeded as exc:
        if exc.what == "bytes":
            raise _too_large(path, sample_index, exc.value, max_bytes) from None
        what = (
            "contains itself (a cycle)"
            if exc.what == "cycle"
            else f"nests containers deeper than max_depth={max_depth}"
        )
        raise SampleTooDeepError(
            path,
            f"sample {what}; collating, converting or sending it to another process would "
            "exhaust the recursion limit (raise max_depth, or None, if the data is meant so)",
            sample=sample_index,
        ) from None


def _leaf_total_py(sample: tuple[Any, ...]) -> int:
    """The sum of the sizes of ``sample``'s values when all are leaves, else -1."""
    total = 0
    for v in sample:
        size = _leaf(v)
        if size < 0:
            return -1
        total += size
    return total


def _too_large(
    path: str, sample_index: int | None, size: int, max_bytes: int | None
) -> SampleTooLargeError:
    return SampleTooLargeError(
        path,
        f"sample decodes to more than max_sample_bytes={max_bytes} bytes (at least {size}, "
        "counting shared objects once per reference); raise max_sample_bytes, or pass None, "
        "if samples this large are meant",
        sample=sample_index,
    )


# the compiled walk, optional: without the extension the reference above does it all
_FALLBACK: object = CORE.MEASURE_FALLBACK if CORE is not None else object()
_measure_tree: Any = CORE.measure_tree if CORE is not None else None
_check_tree: Any = CORE.check_tree if CORE is not None else None
