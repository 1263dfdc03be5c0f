"""One byte-budget cache for every cache of pickleshard, and one counter type for all of them.

:class:`BudgetCache` maps keys to values that each count ``nbytes`` against a ``budget`` stated
when it is made; an :class:`Eviction` policy chooses which entry leaves when room is needed
(:class:`LeastRecentlyUsed` by default); :class:`CacheStats` counts what it did. Its users: the
whole-file cache (decoded or mapped files, bytes of decoded size), the remote block cache (bytes
of blocks), the open span readers of a dataset (a count: each reader counts 1) and the shared
values of a span reader (bytes of ``sys.getsizeof``).

A new policy is one small class: subclass :class:`Eviction` (or a policy near it, as
:class:`FirstInFirstOut` does :class:`LeastRecentlyUsed`), give it a ``name`` and pass the class
as ``eviction=``; :func:`register_eviction` makes it known by name.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, overload

__all__ = [
    "EVICTIONS",
    "BudgetCache",
    "CacheStats",
    "Eviction",
    "FirstInFirstOut",
    "LeastRecentlyUsed",
    "eviction_named",
    "register_eviction",
]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


@dataclass
class CacheStats:
    """What one :class:`BudgetCache` did in this process.

    ``hits`` and ``misses`` count lookups (:meth:`BudgetCache.get`); ``loads`` the entries put
    in and ``bytes_loaded`` their sizes summed; ``evictions`` the entries the policy pushed out
    to make room (:meth:`BudgetCache.clear` is not an eviction); ``bytes_used`` and ``entries``
    what is held now; ``peak_bytes`` the most ``bytes_used`` has been.
    """

    hits: int = 0
    misses: int = 0
    loads: int = 0
    bytes_loaded: int = 0
    evictions: int = 0
    bytes_used: int = 0
    peak_bytes: int = 0
    entries: int = 0


class Eviction(Generic[K]):
    """Which entry of a :class:`BudgetCache` leaves next: told of every key that comes, is used
    and goes, it names the :meth:`victim` when the cache needs room.

    ``keeps_recent`` declares that an entry is never chosen before one whose last use came
    before the first entry was put in. Then a working set that fits the budget, once loaded, is
    held whole while the entries used before it go first: what
    :class:`~pickleshard.samplers.BlockShuffleSampler` relies on to load each file once per
    window. LRU and FIFO keep it; LFU or random eviction do not.
    """

    name: ClassVar[str]
    keeps_recent: ClassVar[bool] = False

    def admitted(self, key: K) -> None:
        """``key`` was put in the cache."""
        raise NotImplementedError

    def used(self, key: K) -> None:
        """``key`` was found by a lookup."""
        raise NotImplementedError

    def removed(self, key: K) -> None:
        """``key`` left the cache (evicted, replaced or cleared)."""
        raise NotImplementedError

    def victim(self) -> K:
        """The key to evict next (the cache holds at least one)."""
        raise NotImplementedError


class LeastRecentlyUsed(Eviction[K]):
    """The entry used (or put in) longest ago goes first."""

    name = "lru"
    keeps_recent = True

    def __init__(self) -> None:
        self._order: OrderedDict[K, None] = OrderedDict()  # oldest first

    def admitted(self, key: K) -> None:
        self._order[key] = None

    def used(self, key: K) -> None:
        self._order.move_to_end(key)

    def removed(self, key: K) -> None:
        del self._order[key]

    def victim(self) -> K:
        return next(iter(self._order))


class FirstInFirstOut(LeastRecentlyUsed[K]):
    """The entry put in longest ago goes first, however often it was used since."""

    name = "fifo"

    def used(self, key: K) -> None:
        pass  # use does not reorder: only admission does


EVICTIONS: dict[str, type[Eviction]] = {}  # type: ignore[type-arg]  # any key type


def register_eviction(policy: type[Eviction[K]]) -> type[Eviction[K]]:
    """Make ``policy`` known by its ``name``; a name taken by another class is refused."""
    known = EVICTIONS.get(policy.name)
    if known is not None and known is not policy:
        raise ValueError(f"eviction policy {policy.name!r} is already {known.__qualname__}")
    EVICTIONS[policy.name] = policy
    return policy


def eviction_named(name: str) -> type[Eviction]:  # type: ignore[type-arg]  # any key type
    """The policy registered as ``name``; ValueError naming the known ones otherwise."""
    try:
        return EVICTIONS[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; known: {sorted(EVICTIONS)}") from None


register_eviction(LeastRecentlyUsed)
register_eviction(FirstInFirstOut)


class BudgetCache(Generic[K, V]):
    """Values by key, each counting ``nbytes >= 1`` against ``budget``, evicted by a policy.

    The bound, enforced by every :meth:`put` and :meth:`make_room`::

        bytes_used <= max(budget, nbytes of the entry put last)
        entries    <= max(budget, 1)

    An entry larger than the budget is held alone until the next :meth:`put` (a whole file
    larger than a worker's share is still read from memory while it is in use). An owner that
    knows an entry's size before making it calls :meth:`make_room` first, so the bound holds
    while the entry is being made too. ``budget`` is bytes, or any unit the owner sizes entries
    in (open readers count 1 each: ``budget`` is then a count).

    ``eviction`` is the policy class (a new instance per cache); ``dropped(value)`` is called
    for each value that leaves by eviction, replacement or :meth:`clear` (readers are closed so).
    Not thread-safe by itself: a lookup stays a dict read. An owner that threads share holds
    :attr:`lock` around its calls (across a load, so that two threads do not load one key). One
    cache per process: hold it in a :class:`~pickleshard.io.handles.ProcessLocal`, and a forked
    child gets a new one, with a new lock and counters from zero. Pickled, it carries its
    budget, policy and ``dropped``, and no entries: the receiver starts empty.
    """

    def __init__(
        self,
        budget: int,
        *,
        eviction: Callable[[], Eviction[K]] = LeastRecentlyUsed,
        dropped: Callable[[V], None] | None = None,
    ) -> None:
        if budget < 0:
            raise ValueError(f"a cache's budget must be >= 0, got {budget}")
        self._budget = budget
        self._policy = eviction
        self.eviction = eviction()
        self._used = self.eviction.used  # bound once: a hit is on every ds[i]'s path
        self.stats = CacheStats()
        self.lock = threading.Lock()
        self._dropped = dropped
        self._entries: dict[K, tuple[V, int]] = {}

    @property
    def budget(self) -> int:
        """What the entries may count in all (see the class docstring for the bound)."""
        return self._budget

    def resize(self, budget: int) -> None:
        """Change the budget, evicting at once what the new one does not hold."""
        if budget < 0:
            raise ValueError(f"a cache's budget must be >= 0, got {budget}")
        self._budget = budget
        self.make_room(0)

    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: object = None) -> object:
        """The value held for ``key`` (a hit), else ``default`` (a miss)."""
        entry = self._entries.get(key)
        stats = self.stats
        if entry is None:
            stats.misses += 1
            return default
        stats.hits += 1
        self._used(key)
        return entry[0]

    def put(self, key: K, value: V, nbytes: int) -> None:
        """Hold ``value`` for ``key`` at ``nbytes``, evicting as the policy says to make room
        (all others, for an entry larger than the budget); a value held for ``key`` is
        replaced."""
        if nbytes < 1:
            raise ValueError(f"an entry counts at least 1 against the budget, got {nbytes}")
        if key in self._entries:
            self._remove(key)
        self.make_room(nbytes)
        self._entries[key] = (value, nbytes)
        self.eviction.admitted(key)
        stats = self.stats
        stats.loads += 1
        stats.bytes_loaded += nbytes
        stats.entries += 1
        stats.bytes_used += nbytes
        if stats.bytes_used > stats.peak_bytes:
            stats.peak_bytes = stats.bytes_used

    def make_room(self, nbytes: int) -> None:
        """Evict until an entry of ``nbytes`` fits the budget, or nothing is left."""
        stats = self.stats
        while self._entries and stats.bytes_used + nbytes > self._budget:
            self._remove(self.eviction.victim())
            stats.evictions += 1

    def clear(self) -> None:
        """Drop every entry (counters other than what is held stay)."""
        while self._entries:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: K) -> None:
        value, nbytes = self._entries.pop(key)
        self.eviction.removed(key)
        self.stats.entries -= 1
        self.stats.bytes_used -= nbytes
        if self._dropped is not None:
            self._dropped(value)

    def __getstate__(self) -> dict[str, Any]:
        return {"budget": self._budget, "eviction": self._policy, "dropped": self._dropped}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["budget"], eviction=state["eviction"], dropped=state["dropped"]
        )

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held (not a lookup: no counter moves, the policy is not told)."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
