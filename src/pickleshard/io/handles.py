"""One value per process: a descriptor, mapping, client or environment, opened on first use,
opened anew in a forked child, and closed only by the process that opened it.

Every class of pickleshard that holds such a thing holds it in a :class:`ProcessLocal` and never
compares ``os.getpid()`` itself. A forked DataLoader worker inherits its parent's objects: a
descriptor it did not open shares the parent's file offset and must not be closed by the child,
an LMDB environment or an fsspec client must not be used across a fork at all. The check is a
list read against a counter that ``os.register_at_fork`` advances in each child, not a system
call per read.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ProcessLocal", "WeakMethod", "fork_generation"]

T = TypeVar("T")

# _FORKS[0] counts the forks that led to this process (0 in a process that was not forked).
_FORKS = [0]

# The values a forked child must close at the fork, not merely drop (see ``close_inherited``).
_CLOSE_IN_CHILD: weakref.WeakSet[ProcessLocal[Any]] = weakref.WeakSet()


# Values a forked child inherited and replaced, kept referenced: dropping them would run their
# finalizers in the child (an HTTP client's session closing connections it shares with the
# parent), which is the parent's business.
_INHERITED: list[Any] = []


def _forked() -> None:
    _FORKS[0] += 1
    for local in list(_CLOSE_IN_CHILD):
        local._close_inherited()


os.register_at_fork(after_in_child=_forked)


def fork_generation() -> int:
    """How many forks led to this process: a value opened at another generation is not ours."""
    return _FORKS[0]


class ProcessLocal(Generic[T]):
    """``open()``'s value, once per process.

    :meth:`get` opens it on first use and again after a fork (the inherited value is kept
    referenced, never closed nor finalized in the child: it belongs to the parent); :meth:`close` calls ``close(value)`` only in the
    process that opened it, and so does dropping the last reference to the ProcessLocal. With
    ``close_inherited=True`` a forked child instead calls ``close`` on the value it inherited,
    at the fork: for a value the child must not even hold (a decoder whose threads stayed in
    the parent aborts the child's interpreter at exit; py-lmdb refuses to open an environment
    that the process still holds, and a child holds its parent's). Pickled (to a spawned worker
    or a Dask task) it carries ``open`` and ``close`` and no value: the receiver opens its own.

    ``open`` should not refer to the object holding the ProcessLocal when ``close`` is given:
    the reference cycle would delay the close on drop until the cyclic garbage collector runs.
    """

    __slots__ = ("__weakref__", "_close", "_generation", "_inherit", "_open", "_value")

    def __init__(
        self,
        open: Callable[[], T],
        close: Callable[[T], None] | None = None,
        *,
        close_inherited: bool = False,
    ) -> None:
        self._open = open
        self._close = close
        self._inherit = close_inherited
        self._value: T | None = None
        self._generation = -1  # no value opened yet

    def get(self) -> T:
        """This process's value, opened now if it has none."""
        if self._generation != _FORKS[0]:
            if self._value is not None:  # a parent's value: not ours to use, close or finalize
                _INHERITED.append(self._value)
            self._value, self._generation = None, -1
            value = self._open()
            self._value, self._generation = value, _FORKS[0]
            if self._inherit:
                _CLOSE_IN_CHILD.add(self)
            return value
        return self._value  # type: ignore[return-value]  # set with the generation

    @property
    def opened(self) -> bool:
        """Whether this process holds a value it opened (a parent's does not count)."""
        return self._generation == _FORKS[0]

    def peek(self) -> T | None:
        """This process's value if it opened one, else None; opens nothing."""
        return self._value if self._generation == _FORKS[0] else None

    def close(self) -> None:
        """Close the value if this process opened it; a later :meth:`get` opens a new one."""
        value, mine = self._value, self._generation == _FORKS[0]
        self._value, self._generation = None, -1
        if mine and value is not None and self._close is not None:
            self._close(value)

    def _close_inherited(self) -> None:
        """In a forked child, at the fork: close the parent's value (errors are the parent's)."""
        value, self._value, self._generation = self._value, None, -1
        if value is not None and self._close is not None:
            with contextlib.suppress(Exception):
                self._close(value)

    def __del__(self) -> None:
        # closed here only if this process opened it; try, not contextlib: at interpreter exit
        # module globals may be gone, and there is no one left to tell of an error
        try:
            if self._generation >= 0:
                self.close()
        except Exception:
            pass

    def __getstate__(self) -> dict[str, Any]:
        return {"open": self._open, "close": self._close, "close_inherited": self._inherit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["open"], state["close"], close_inherited=state.get("close_inherited", False)
        )


class WeakMethod:
    """``getattr(obj, name)`` called, ``obj`` held weakly: a callback an object hands to what it
    owns without the reference cycle (``obj`` -> owned -> bound method -> ``obj``) that would keep
    it, its descriptors and maps until the cyclic garbage collector runs. Pickles as the method
    of ``obj`` (pickled with its owner, ``obj`` comes along; the copy holds the copy weakly).
    Calling it after ``obj`` is gone raises ``ReferenceError``."""

    __slots__ = ("_name", "_ref")

    def __init__(self, obj: object, name: str) -> None:
        self._ref = weakref.ref(obj)
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        obj = self._ref()
        if obj is None:
            raise ReferenceError(f"{self._name}: its object was dropped")
        return getattr(obj, self._name)(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        obj = self._ref()
        if obj is None:
            raise ReferenceError(f"{self._name}: its object was dropped")
        return (WeakMethod, (obj, self._name))
