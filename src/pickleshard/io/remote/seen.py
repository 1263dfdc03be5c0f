"""An object's identity as last seen, asked for again once too old, one request at a time.

A reader checks its object's identity after every batch (a write racing the reads shows
there), and a metadata request per batch would double the round trips, so the identity seen is
used for ``ttl`` seconds from when it was *asked for* (:class:`SeenIdentity`). A loader's
threads checking at once would each ask; here they share one request in flight. Past half the
``ttl`` the request goes out in the background, so a reader seldom waits for it: the identity
it gets is never older than ``ttl``, as before, and almost never costs a round trip.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ..handles import ProcessLocal
from ..identity import FileIdentity

__all__ = ["SeenIdentity"]

# this process's threads asking for identities ahead of need (one metadata request each)
_ASKERS: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
    lambda: ThreadPoolExecutor(4, thread_name_prefix="pickleshard-identity")
)


class SeenIdentity:
    """``seen``: ``(when asked, identity)``; :meth:`current` the identity at most ``ttl``
    seconds old, asking through ``ask`` (the metadata request) when it is not; ``asked``
    is told each answer with its time (what other opens reuse)."""

    __slots__ = ("_flight", "_lock", "ask", "asked", "seen")

    def __init__(
        self,
        seen: tuple[float, FileIdentity],
        ask: Callable[[], FileIdentity],
        asked: Callable[[float, FileIdentity], None],
    ) -> None:
        self.seen, self.ask, self.asked = seen, ask, asked
        self._lock = threading.Lock()
        self._flight: Future[FileIdentity] | None = None

    def current(self, ttl: float) -> FileIdentity:
        """The identity asked for at most ``ttl`` seconds ago (see the module)."""
        when, identity = self.seen
        age = time.monotonic() - when
        if age <= ttl:
            if age > ttl / 2 and self._flight is None:
                flight, mine = self._join()
                if mine:
                    _ASKERS.get().submit(self._send, flight)
            return identity
        flight, mine = self._join()
        if mine:
            self._send(flight)
        return flight.result()

    def _join(self) -> tuple[Future[FileIdentity], bool]:
        """The request in flight, and whether the caller is to send it (none was)."""
        with self._lock:
            if self._flight is not None:
                return self._flight, False
            self._flight = Future()
            return self._flight, True

    def _send(self, flight: Future[FileIdentity]) -> None:
        """Ask now; the answer (or the error) to ``flight``."""
        try:
            when = time.monotonic()
            identity = self.ask()
            self.seen = (when, identity)
            self.asked(when, identity)
            flight.set_result(identity)
        except BaseException as exc:
            flight.set_exception(exc)
        finally:
            with self._lock:
                self._flight = None
