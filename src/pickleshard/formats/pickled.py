"""Values pickle writes for formats: protocol 5, and one ``TypeError`` for what it cannot write."""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["pickle_value"]

# What pickle.dumps raises for a value it cannot write (a lambda, a local class, an open file).
_PICKLING_ERRORS = (pickle.PicklingError, TypeError, AttributeError, RecursionError, ValueError)


def pickle_value(value: Any) -> bytes:
    """``pickle.dumps(value, protocol=5)``; ``TypeError`` naming the type if pickle refuses."""
    try:
        return pickle.dumps(value, protocol=5)
    except _PICKLING_ERRORS as exc:
        t = type(value)
        raise TypeError(
            f"cannot store a value of type {t.__module__}.{t.__qualname__}: pickle refuses it "
            f"({type(exc).__name__}: {exc})"
        ) from None
