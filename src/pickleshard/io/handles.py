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

import os
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ProcessLocal", "fork_generation"]

T = TypeVar("T")

# _FORKS[0] counts the forks that led to this process (0 in a process that was not forked).
_FORKS = [0]


def _forked() -> None:
    _FORKS[0] += 1


os.register_at_fork(after_in_child=_forked)


def fork_generation() -> int:
    """How many forks led to this process: a value opened at another generation is not ours."""
    return _FORKS[0]


class ProcessLocal(Generic[T]):
    """``open()``'s value, once per process.

    :meth:`get` opens it on first use and again after a fork (the inherited value is dropped,
    not closed: it belongs to the parent); :meth:`close` calls ``close(value)`` only in the
    process that opened it. Pickled (to a spawned worker or a Dask task) it carries ``open`` and
    ``close`` and no value: the receiver opens its own.
    """

    __slots__ = ("_close", "_generation", "_open", "_value")

    def __init__(self, open: Callable[[], T], close: Callable[[T], None] | None = None) -> None:
        self._open = open
        self._close = close
        self._value: T | None = None
        self._generation = -1  # no value opened yet

    def get(self) -> T:
        """This process's value, opened now if it has none."""
        if self._generation != _FORKS[0]:
            self._value, self._generation = None, -1  # a parent's value: not ours to use or close
            value = self._open()
            self._value, self._generation = value, _FORKS[0]
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

    def __getstate__(self) -> dict[str, Any]:
        return {"open": self._open, "close": self._close}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["open"], state["close"])  # type: ignore[misc]
