"""Deep comparison of a read value with ``pickle.load``'s, for the corpus and fault workers."""

from __future__ import annotations

import math
from itertools import repeat
from typing import Any

import numpy as np

from pickleshard.picklekit.gcpause import paused_gc

__all__ = ["deep_diff"]


def deep_diff(got: Any, want: Any) -> str | None:
    """How ``got`` differs from ``want`` (types, values, array bits), or None; iterative, so
    100,000 nested lists compare without recursion (the report gives the nesting depth)."""
    with paused_gc():  # the walk makes no cycles; GC passes over deep values would dominate it
        return _deep_diff(got, want)


def _deep_diff(got: Any, want: Any) -> str | None:
    todo: list[tuple[Any, Any, int]] = [(got, want, 0)]
    while todo:
        g, w, depth = todo.pop()
        tw = type(w)
        if type(g) is not tw:
            return f"depth {depth}: {type(g).__name__} != {tw.__name__}"
        if tw is list or tw is tuple:
            if len(g) != len(w):
                return f"depth {depth}: length {len(g)} != {len(w)}"
            todo.extend(zip(g, w, repeat(depth + 1)))
        elif isinstance(w, np.ndarray):
            if (g.dtype, g.shape) != (w.dtype, w.shape):
                return f"depth {depth}: array {g.dtype}{g.shape} != {w.dtype}{w.shape}"
            if w.dtype.hasobject:
                todo.extend(zip(g.flat, w.flat, repeat(depth + 1)))
            elif g.tobytes() != w.tobytes():
                return f"depth {depth}: array bytes differ"
        elif isinstance(w, (list, tuple)):
            if len(g) != len(w):
                return f"depth {depth}: length {len(g)} != {len(w)}"
            todo.extend(zip(g, w, repeat(depth + 1)))
        elif isinstance(w, dict):
            keys_g, keys_w = list(g), list(w)
            if [type(k) for k in keys_g] != [type(k) for k in keys_w] or keys_g != keys_w:
                return f"depth {depth}: dict keys differ"
            todo.extend((g[k], w[k], depth + 1) for k in keys_w)
        elif isinstance(w, float) and math.isnan(w):
            if not math.isnan(g):
                return f"depth {depth}: {g!r} != nan"
        elif isinstance(w, np.generic):
            if g.tobytes() != w.tobytes():
                return f"depth {depth}: {g!r} != {w!r}"
        elif g != w:
            return f"depth {depth}: {g!r} != {w!r}"
    return None
