"""The one byte-budget cache (:mod:`pickleshard.io.lru`): its bound, its counters, its policies,
and a stateful test of every registered policy against a plain model of it."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pickleshard.io.lru import (
    EVICTIONS,
    BudgetCache,
    CacheStats,
    Eviction,
    FirstInFirstOut,
    LeastRecentlyUsed,
    eviction_named,
    register_eviction,
)


def _filled(budget: int, sizes: dict[str, int], **kwargs: object) -> BudgetCache[str, str]:
    cache: BudgetCache[str, str] = BudgetCache(budget, **kwargs)  # type: ignore[arg-type]
    for key, size in sizes.items():
        cache.put(key, key.upper(), size)
    return cache


def test_counts_hits_misses_loads_and_evictions_exactly() -> None:
    cache = _filled(25, {"a": 10, "b": 10})
    assert cache.get("a") == "A"
    assert cache.get("zz") is None
    assert cache.get("zz", "default") == "default"
    cache.put("c", "C", 10)  # b is the least recently used: it goes
    assert ("b" in cache, "a" in cache, "c" in cache) == (False, True, True)
    s = cache.stats
    assert (s.hits, s.misses, s.loads, s.bytes_loaded, s.evictions) == (1, 2, 3, 30, 1)
    assert (s.bytes_used, s.entries, s.peak_bytes, len(cache)) == (20, 2, 20, 2)


def test_the_budget_is_never_exceeded() -> None:
    cache: BudgetCache[int, int] = BudgetCache(20)
    for k, size in enumerate([7, 3, 12, 5, 9, 1, 11, 4, 8, 2, 20, 6] * 3):
        cache.put(k % 7, k, size)
        assert cache.stats.bytes_used <= 20
        assert cache.stats.bytes_used == sum(cache._entries[key][1] for key in cache._entries)
    assert cache.stats.peak_bytes <= 20
    assert cache.stats.evictions > 0


def test_make_room_keeps_the_budget_while_an_entry_is_made() -> None:
    cache = _filled(20, {"a": 8, "b": 8})
    cache.make_room(10)  # a (least recently used) goes before the 10-byte entry exists
    assert (list(cache._entries), cache.stats.bytes_used, cache.stats.evictions) == (["b"], 8, 1)
    cache.put("c", "C", 10)
    assert cache.stats.peak_bytes == 18 <= 20


def test_an_entry_over_the_budget_is_held_alone_until_the_next_put() -> None:
    cache = _filled(10, {"small": 4, "also": 4})
    cache.put("huge", "HUGE", 50)
    assert (list(cache._entries), cache.stats.bytes_used, cache.stats.peak_bytes) == (
        ["huge"],
        50,
        50,
    )
    assert cache.get("huge") == "HUGE"  # read from memory while it is in use
    cache.put("small", "SMALL", 4)
    assert (list(cache._entries), cache.stats.bytes_used, cache.stats.evictions) == (
        ["small"],
        4,
        3,
    )


def test_a_zero_budget_holds_the_last_entry_alone() -> None:
    cache = _filled(0, {"a": 1, "b": 1})
    assert (list(cache._entries), cache.stats.evictions) == (["b"], 1)


def test_replacing_a_key_is_not_an_eviction() -> None:
    dropped: list[str] = []
    cache = _filled(100, {"a": 10}, dropped=dropped.append)
    cache.put("a", "A2", 30)
    assert (cache.get("a"), cache.stats.bytes_used, cache.stats.entries) == ("A2", 30, 1)
    assert (cache.stats.evictions, dropped) == (0, ["A"])


def test_dropped_sees_every_value_that_leaves() -> None:
    dropped: list[str] = []
    cache = _filled(2, {"a": 1, "b": 1, "c": 1}, dropped=dropped.append)
    assert dropped == ["A"]
    cache.clear()
    assert sorted(dropped) == ["A", "B", "C"]
    assert (len(cache), cache.stats.bytes_used, cache.stats.entries) == (0, 0, 0)
    assert (cache.stats.loads, cache.stats.evictions) == (3, 1)  # counters stay; clear evicts none


def test_resize_evicts_at_once() -> None:
    cache = _filled(30, {"a": 10, "b": 10, "c": 10})
    cache.resize(15)
    assert (list(cache._entries), cache.budget, cache.stats.evictions) == (["c"], 15, 2)


def test_bad_sizes_and_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="budget must be >= 0"):
        BudgetCache(-1)
    cache: BudgetCache[str, str] = BudgetCache(10)
    with pytest.raises(ValueError, match="at least 1"):
        cache.put("a", "A", 0)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        cache.resize(-1)


def test_lru_and_fifo_differ_only_in_what_a_use_does() -> None:
    for policy, survivor in ((LeastRecentlyUsed, "a"), (FirstInFirstOut, "b")):
        cache = _filled(20, {"a": 10, "b": 10}, eviction=policy)
        cache.get("a")  # LRU: a is now the most recent; FIFO: a still came in first
        cache.put("c", "C", 10)
        assert list(cache._entries) == sorted([survivor, "c"]), policy.name


class MostRecentlyUsed(LeastRecentlyUsed[str]):
    """A new policy is one small class: the entry used last goes first."""

    name = "test-mru"
    keeps_recent = False

    def victim(self) -> str:
        return next(reversed(self._order))


@pytest.fixture
def mru() -> Iterator[type[MostRecentlyUsed]]:
    register_eviction(MostRecentlyUsed)
    yield MostRecentlyUsed
    del EVICTIONS[MostRecentlyUsed.name]


def test_a_new_policy_is_one_class_and_one_call(mru: type[MostRecentlyUsed]) -> None:
    cache = _filled(20, {"a": 10, "b": 10}, eviction=eviction_named("test-mru"))
    cache.put("c", "C", 10)
    assert list(cache._entries) == ["a", "c"]
    assert register_eviction(mru) is mru  # the same class again: nothing to refuse


def test_the_registry_refuses_a_second_class_under_a_taken_name() -> None:
    assert (eviction_named("lru"), eviction_named("fifo")) == (LeastRecentlyUsed, FirstInFirstOut)
    assert LeastRecentlyUsed.keeps_recent
    assert FirstInFirstOut.keeps_recent

    class Impostor(LeastRecentlyUsed[str]):
        name = "lru"

    with pytest.raises(ValueError, match="already LeastRecentlyUsed"):
        register_eviction(Impostor)
    assert EVICTIONS["lru"] is LeastRecentlyUsed
    with pytest.raises(ValueError, match="unknown eviction policy 'nope'"):
        eviction_named("nope")


# -- a stateful test against a model ----------------------------------------------------------


class _Model:
    """What a policy should do, written plainly: keys in eviction order, their sizes."""

    def __init__(self, budget: int, moves_on_use: bool) -> None:
        self.budget, self.moves_on_use = budget, moves_on_use
        self.order: list[str] = []
        self.sizes: dict[str, int] = {}
        self.hits = self.misses = self.loads = self.evictions = self.peak = 0
        self.last_put = ""

    @property
    def used(self) -> int:
        return sum(self.sizes.values())

    def get(self, key: str) -> bool:
        if key not in self.sizes:
            self.misses += 1
            return False
        self.hits += 1
        if self.moves_on_use:
            self.order.remove(key)
            self.order.append(key)
        return True

    def make_room(self, n: int) -> None:
        while self.order and self.used + n > self.budget:
            del self.sizes[self.order.pop(0)]
            self.evictions += 1

    def put(self, key: str, n: int) -> None:
        if key in self.sizes:
            self.order.remove(key)
            del self.sizes[key]
        self.make_room(n)
        self.order.append(key)
        self.sizes[key] = n
        self.loads += 1
        self.peak = max(self.peak, self.used)
        self.last_put = key


KEYS = st.sampled_from("abcde")  # few keys, small sizes: hits and evictions both common
SIZES = st.integers(1, 16)


class BudgetCacheMachine(RuleBasedStateMachine):
    policy: type[Eviction[str]] = LeastRecentlyUsed

    @initialize(budget=st.integers(0, 48))
    def start(self, budget: int) -> None:
        self.cache: BudgetCache[str, tuple[str, int]] = BudgetCache(budget, eviction=self.policy)
        self.model = _Model(budget, moves_on_use=self.policy is not FirstInFirstOut)
        self.version = 0  # each put stores a new value: a stale one would show

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        found = self.model.get(key)
        got = self.cache.get(key)
        assert (got is not None) == found
        if got is not None:
            assert got[0] == key

    @rule(key=KEYS, n=SIZES)
    def put(self, key: str, n: int) -> None:
        self.version += 1
        self.model.put(key, n)
        self.cache.put(key, (key, self.version), n)

    @rule(n=SIZES)
    def make_room(self, n: int) -> None:
        self.model.make_room(n)
        self.cache.make_room(n)

    @rule()
    def clear(self) -> None:
        self.model.order, self.model.sizes = [], {}
        self.cache.clear()

    @invariant()
    def agrees_with_the_model(self) -> None:
        m, s = self.model, self.cache.stats
        assert sorted(self.cache._entries) == sorted(m.order)
        assert (s.hits, s.misses, s.loads, s.evictions) == (m.hits, m.misses, m.loads, m.evictions)
        assert (s.bytes_used, s.entries, s.peak_bytes) == (m.used, len(m.order), m.peak)

    @invariant()
    def keeps_its_bound(self) -> None:
        s, budget = self.cache.stats, self.cache.budget
        # over the budget only while the entry put last is held, alone
        assert s.bytes_used <= budget or list(self.cache._entries) == [self.model.last_put]
        assert s.entries <= max(budget, 1)


class FifoMachine(BudgetCacheMachine):
    policy = FirstInFirstOut


TestLeastRecentlyUsed = BudgetCacheMachine.TestCase
TestFirstInFirstOut = FifoMachine.TestCase
TestLeastRecentlyUsed.settings = TestFirstInFirstOut.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)


def test_pickled_it_carries_its_settings_and_no_entries() -> None:
    cache = _filled(20, {"a": 10, "b": 10}, eviction=FirstInFirstOut, dropped=print)
    back = pickle.loads(pickle.dumps(cache))
    assert (len(back), back.budget, back.stats) == (0, 20, CacheStats())
    assert (type(back.eviction), back._dropped) == (FirstInFirstOut, print)
    assert len(cache) == 2  # the original keeps its own
