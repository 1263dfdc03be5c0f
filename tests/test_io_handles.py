"""``ProcessLocal``: one value per process, reopened after a fork, closed only by its opener."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable

import pytest

from pickleshard.io.handles import ProcessLocal, fork_generation


class Opener:
    def __init__(self) -> None:
        self.opened = 0
        self.closed: list[int] = []

    def open(self) -> int:
        self.opened += 1
        return self.opened

    def close(self, value: int) -> None:
        self.closed.append(value)


def test_opens_once_and_closes_what_it_opened() -> None:
    o = Opener()
    h = ProcessLocal(o.open, o.close)
    assert not h.opened
    assert h.peek() is None
    assert h.get() == 1
    assert h.get() == 1
    assert h.opened
    h.close()
    assert o.closed == [1]
    assert h.get() == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_and_never_closes_the_parents() -> None:
    o = Opener()
    h = ProcessLocal(o.open, o.close)
    assert h.get() == 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: reports what it saw through the pipe, then exits at once
        report = [fork_generation(), int(h.opened), int(h.peek() is None)]
        h.close()  # not the child's to close: nothing is closed
        report.append(len(o.closed))
        report.append(h.get())  # opens its own
        os.write(w, pickle.dumps(report))
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        generation, opened, peek_none, closed, value = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert generation == fork_generation() + 1
    assert (opened, peek_none, closed, value) == (0, 1, 0, 2)
    assert h.get() == 1  # the parent's value is untouched
    assert o.closed == []


def test_pickled_it_carries_no_value() -> None:
    h = ProcessLocal(list, None)
    h.get().append(1)
    copy = pickle.loads(pickle.dumps(h))
    assert not copy.opened
    assert copy.get() == []


def test_dropping_it_closes_what_this_process_opened() -> None:
    o = Opener()
    h = ProcessLocal(o.open, o.close)
    h.get()
    del h
    assert o.closed == [1]
    unopened = ProcessLocal(o.open, o.close)
    del unopened
    assert o.closed == [1]


def _in_child(report: Callable[[], list[int]]) -> list[int]:
    """What ``report()`` returns in a forked child (sent back through a pipe)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, pickle.dumps(report()))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got: list[int] = pickle.loads(f.read())
    os.waitpid(pid, 0)
    return got


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_dropping_it_closes_nothing() -> None:
    o = Opener()
    h = ProcessLocal(o.open, o.close)
    h.get()

    def report() -> list[int]:
        nonlocal h
        del h
        return list(o.closed)

    assert _in_child(report) == []
    assert h.get() == 1
    assert o.closed == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_close_inherited_closes_the_parents_value_in_the_child_at_the_fork() -> None:
    o = Opener()
    h = ProcessLocal(o.open, o.close, close_inherited=True)
    plain = ProcessLocal(o.open, o.close)
    assert (h.get(), plain.get()) == (1, 2)
    # in the child, before it touches either: the inherited value of h (only) is closed
    child = _in_child(lambda: [*o.closed, int(h.opened), h.get(), *o.closed])
    assert child == [1, 0, 3, 1]
    assert o.closed == []  # the parent's own stays open
    assert (h.get(), plain.get()) == (1, 2)
    assert pickle.loads(pickle.dumps(h)).__getstate__()["close_inherited"] is True


class _Finalized:
    """Writes ``b"x"`` to ``fd`` when finalized."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.write(self.fd, b"x")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_finalizes_the_parents_value() -> None:
    """Dropping an inherited client in the child would run its finalizer there (an HTTP
    session closing connections the parent still uses): the child keeps it referenced."""
    import gc

    r, w = os.pipe()
    h = ProcessLocal(lambda: _Finalized(w))
    h.get()
    pid = os.fork()
    if pid == 0:
        h.get()  # the child's own value
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    os.set_blocking(r, False)
    try:
        got = os.read(r, 16)
    except BlockingIOError:
        got = b""
    assert got == b""  # nothing was finalized in the child
    h.close()  # the parent's own value, finalized here: the pipe is still open for it
    gc.collect()
    os.close(r)
    os.close(w)
