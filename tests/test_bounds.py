"""Per-sample bounds: the compiled walk (``_cscan.measure_tree``) against the Python reference
(``bounds._measure_py``): the same ``(bytes, depth)`` or the same ``BoundExceeded(what, value)``,
on generated trees with shared containers, cycles and values the compiled walk leaves to the
reference; plus hand-computed sizes, the exact bounds and a 10**6-deep sample."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pickleshard.errors import BoundExceeded, SampleTooDeepError, SampleTooLargeError
from pickleshard.safety import bounds

cscan = pytest.importorskip("pickleshard._cscan")

_NO_BOUND = 1 << 62
_COMMON = (int, str, bytes, bytearray, float, bool, type(None), complex, range, slice)


def _outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except BoundExceeded as exc:
        return ("exceeded", exc.what, exc.value)


def _compiled(sample: Any, max_bytes: int | None, max_depth: int | None) -> Any:
    """``measure_tree`` as :func:`bounds.measure` calls it."""
    limit = _NO_BOUND if max_bytes is None else max_bytes
    deepest = _NO_BOUND if max_depth is None else max_depth
    return _outcome(cscan.measure_tree, sample, limit, deepest, deepest <= bounds._RECURSE_MAX)


def _common_only(sample: Any) -> bool:
    """Whether the compiled walk knows every value of ``sample`` (so it must not decline)."""
    seen: set[int] = set()
    todo = [sample]
    while todo:
        v = todo.pop()
        t = type(v)
        if t in (list, tuple, dict):
            if id(v) not in seen:
                seen.add(id(v))
                todo.extend(list(v.keys()) + list(v.values()) if t is dict else v)
        elif t is np.ndarray:
            if v.dtype.hasobject:
                return False
        elif t not in _COMMON:
            return False
    return True


_ints = st.one_of(
    st.integers(-(2**64), 2**64),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, -(2**64), 0, -1]),
    st.integers(-(10**80), 10**80),
)
_arrays = st.builds(
    lambda n, dt: np.arange(n).astype(dt), st.integers(0, 6), st.sampled_from(["i1", "f4", "i8"])
)
_leaves = st.one_of(
    _ints,
    st.text(max_size=12),
    st.binary(max_size=12),
    st.floats(),
    st.booleans(),
    st.none(),
    _arrays,
)
_odd = st.one_of(  # values the compiled walk hands to the reference
    st.frozensets(st.integers(), max_size=3),
    st.builds(lambda n: np.array([n, "a", [n]], dtype=object), st.integers()),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(set, st.lists(st.integers(), max_size=3)),
    st.builds(lambda x: type("Sub", (list,), {})([x]), st.integers()),
)
_keys = st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=6), st.none(), st.booleans())


def _trees(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.lists(kids, max_size=4),
            st.lists(kids, max_size=4).map(tuple),
            st.dictionaries(_keys, kids, max_size=4),
        ),
        max_leaves=24,
    )


def _mutables(sample: Any) -> list[Any]:
    found: list[Any] = []
    seen: set[int] = set()
    todo = [sample]
    while todo:
        v = todo.pop()
        if type(v) in (list, tuple, dict) and id(v) not in seen:
            seen.add(id(v))
            if type(v) is not tuple:
                found.append(v)
            todo.extend(v.values() if type(v) is dict else v)
    return found


@st.composite
def _samples(draw: st.DrawFn) -> Any:
    """A tree, then a few references from a list or dict to another container: shared
    containers, or cycles when the target is an ancestor (or itself)."""
    leaves = st.one_of(_leaves, _odd) if draw(st.integers(0, 4)) == 0 else _leaves
    sample = draw(_trees(leaves))
    mutables = _mutables(sample)
    if mutables:
        for _ in range(draw(st.integers(0, 3))):
            src = draw(st.sampled_from(mutables))
            dst = draw(st.sampled_from(mutables))
            if draw(st.integers(0, 3)) == 0 or src is dst:  # a cycle, rarer
                pass
            elif draw(st.booleans()):
                dst = [dst]  # shared through a new list
            if type(src) is list:
                src.insert(draw(st.integers(0, len(src))), dst)
            else:
                src[draw(_keys)] = dst
    return sample


_limits = st.one_of(st.none(), st.integers(0, 1500))
_depths = st.one_of(st.none(), st.integers(1, 7), st.integers(199, 202))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_samples(), _limits, _depths)
def test_compiled_walk_equals_the_reference(sample: Any, max_bytes: Any, max_depth: Any) -> None:
    expected = _outcome(bounds._measure_py, sample, max_bytes, max_depth)
    assert _outcome(bounds.measure, sample, max_bytes, max_depth) == expected
    got = _compiled(sample, max_bytes, max_depth)
    if _common_only(sample):
        assert got == expected  # answered, not declined
    else:
        assert got is cscan.MEASURE_FALLBACK or got == expected


_leaf_tuples = st.lists(st.one_of(_leaves, _leaves, _odd), max_size=5).map(tuple)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_samples(), _leaf_tuples), _limits, _depths)
def test_check_sample_errors_equal_the_reference(
    sample: Any, max_bytes: Any, max_depth: Any
) -> None:
    def check() -> Any:
        try:
            bounds.check_sample(sample, "f.pkl", 3, max_bytes, max_depth)
        except (SampleTooLargeError, SampleTooDeepError) as exc:
            return type(exc), str(exc)
        return None

    compiled = check()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bounds, "_measure_tree", None)
        mp.setattr(bounds, "_check_tree", None)
        assert check() == compiled


def _tokens() -> Any:
    return ({"tokens": list(range(1000, 1027)), "text": "x" * 21, "score": 0.5}, 5)


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        # tuple 2 refs 16 + dict (3 entries 48 + keys 6+4+5 + list 27 refs and ints 432
        # + text 21 + float 8) + int 8; tuple > dict > list
        (_tokens(), (16 + (48 + 15 + 432 + 21 + 8) + 8, 3)),
        ([2**63 - 1, -(2**63)], (16 + 16, 1)),  # the largest and smallest small ints
        ([2**63, -(2**63) - 1], (16 + 8 + 8, 1)),  # 64 bits: 8 bytes
        ([10**100, -(2**100)], (16 + 41 + 12, 1)),  # 333 and 101 bits
        ((np.zeros((3, 4), "f4"), b"abc", "\u00e9t\u00e9", None, True), (40 + 48 + 3 + 3 + 16, 1)),
        ({}, (0, 1)),
        ([[], ()], (16, 2)),
        (b"abcd", (4, 0)),
        (2**80, (10, 0)),
    ],
)
def test_hand_computed_sizes(sample: Any, expected: tuple[int, int]) -> None:
    assert bounds.measure(sample, None, None) == expected
    assert _compiled(sample, None, 100) == expected
    assert _compiled(sample, None, None) == expected


def test_shared_containers_count_per_reference_and_reach_their_depth() -> None:
    a = [1, 2]  # 16 + 16
    assert _compiled([a, a, a], None, None) == (24 + 3 * 32, 2)
    deep = [[1]]  # height 2, 8 + 16
    sample = [deep, [deep]]  # the second reference sits one level lower: depth 4
    assert _compiled(sample, None, None) == (16 + 24 + (8 + 24), 4)
    assert _compiled(sample, None, 4) == (72, 4)
    assert _compiled(sample, None, 3) == ("exceeded", "depth", 4)  # from the memoized height
    assert _outcome(bounds._measure_py, sample, None, 3) == ("exceeded", "depth", 4)


def test_exact_bounds() -> None:
    sample = [b"abcd"]  # 8 + 4
    assert _compiled(sample, 12, 1) == (12, 1)
    assert _compiled(sample, 11, 1) == ("exceeded", "bytes", 12)
    nested = [[[]]]
    assert _compiled(nested, None, 3) == (16, 3)
    assert _compiled(nested, None, 2) == ("exceeded", "depth", 3)
    assert _compiled(b"abc", 3, 1) == (3, 0)
    assert _compiled(b"abc", 2, 1) == ("exceeded", "bytes", 3)
    keys_first = {b"k" * 10: b"v" * 10}  # 16, key 10, value 10: the key passes 25 first
    assert _compiled(keys_first, 25, None) == ("exceeded", "bytes", 26)
    assert _outcome(bounds._measure_py, keys_first, 25, None) == ("exceeded", "bytes", 26)


def test_cycles_are_refused_as_the_reference_does() -> None:
    loop: list[Any] = []
    loop.append(loop)
    for depth in (1, 2, 100, 200, 201, None):
        expected = _outcome(bounds._measure_py, loop, None, depth)
        assert _compiled(loop, None, depth) == expected
        assert expected[:2] in (("exceeded", "cycle"), ("exceeded", "depth"))
    assert _compiled(loop, None, 100) == ("exceeded", "cycle", 2)  # recursive: child's depth
    assert _compiled(loop, None, None) == ("exceeded", "cycle", 1)  # iterative: parent's
    assert _compiled(loop, None, 1) == ("exceeded", "depth", 2)


def test_million_deep_nesting_without_c_recursion() -> None:
    sample: Any = []
    for _ in range(10**6):
        sample = [sample]
    assert _compiled(sample, None, None) == (8 * 10**6, 10**6 + 1)
    assert bounds.measure(sample, None, None) == (8 * 10**6, 10**6 + 1)
    assert _compiled(sample, None, 100) == ("exceeded", "depth", 101)
    assert _compiled(sample, None, 10**6) == ("exceeded", "depth", 10**6 + 1)
    assert _compiled(sample, 8 * 10**6 - 1, None) == ("exceeded", "bytes", 8 * 10**6)


def test_other_values_go_to_the_reference() -> None:
    obj = np.array([1, "a"], dtype=object)  # walked: 16 + 8 + 1
    assert _compiled([obj], None, None) is cscan.MEASURE_FALLBACK
    assert bounds.measure([obj], None, None) == (8 + 25, 2)
    assert _compiled([{1, 2}], None, None) is cscan.MEASURE_FALLBACK
    assert cscan.leaf_total((np.float32(1), 2)) is cscan.MEASURE_FALLBACK
    assert cscan.leaf_total((np.zeros(10), 5, "ab")) == 80 + 8 + 2
    assert cscan.leaf_total((np.zeros(10), [5])) == -1
    assert cscan.check_tree((np.zeros(10), 5), 88, 1, True) is None  # leaves: no reference bytes
    with pytest.raises(BoundExceeded) as exc:
        cscan.check_tree((np.zeros(10), 5), 87, 1, True)
    assert (exc.value.what, exc.value.value) == ("bytes", 88)
    assert cscan.check_tree((np.zeros(10), np.float32(1)), 87, 1, True) is cscan.MEASURE_FALLBACK
    assert cscan.check_tree(([obj],), 87, 5, True) is cscan.MEASURE_FALLBACK
    assert cscan.check_tree(([1],), 24, 2, True) is None  # 8 + (8 + 8)
    with pytest.raises(BoundExceeded):
        cscan.check_tree(([1],), 24, 1, True)
    # a bound past C's integers: the reference answers
    assert bounds.measure([b"ab"], 2**70, 2**70) == (10, 1)


def test_check_sample_tuple_of_leaves() -> None:
    sample = (np.zeros(10), 5)  # leaves only: 80 + 8, no reference bytes
    bounds.check_sample(sample, "f.pkl", 0, 88, 1)
    with pytest.raises(SampleTooLargeError, match="at least 88"):
        bounds.check_sample(sample, "f.pkl", 0, 87, 1)


def test_a_list_of_small_ints_is_bounded() -> None:
    """The reference skipped the byte check after a small int (its inline fast path), so a
    flat list of small ints passed any max_sample_bytes; now both walks check after each."""
    assert _outcome(bounds._measure_py, [1, 2, 3], 10, 100) == ("exceeded", "bytes", 32)
    assert _compiled([1, 2, 3], 10, 100) == ("exceeded", "bytes", 32)
    with pytest.raises(SampleTooLargeError, match="at least 32"):
        bounds.check_sample([1, 2, 3], "f.pkl", 0, 10, 100)


def test_the_compiled_walk_keeps_reference_counts() -> None:
    inner = [1, "a"]
    loop: list[Any] = [inner]
    loop.append(loop)
    samples: list[Any] = [
        (inner, {"k": inner}),  # answered
        [inner, {1, 2}],  # declined at the set
        loop,  # a cycle: raised
        [[inner] * 3, b"x" * 100],  # past the byte bound: raised
    ]
    for sample in samples:
        before = sys.getrefcount(sample), sys.getrefcount(inner)
        for _ in range(100):
            _compiled(sample, 50, 100)
            _compiled(sample, 50, None)
        assert (sys.getrefcount(sample), sys.getrefcount(inner)) == before


def test_a_structured_arrays_object_fields_are_bounded() -> None:
    """A structured array's ``flat`` gives records (``np.void`` leaves of a few bytes): what
    its object fields refer to must still count toward both bounds, on both walks."""
    deep: Any = 1
    for _ in range(20):
        deep = [deep]
    nested = np.zeros(2, [(("title", "a"), "i4"), ("o", "O"), ("s", [("p", "O")], (2,))])
    nested["o"][0] = deep
    nested["s"]["p"][1, 1] = np.zeros(5000, np.uint8)  # a titled field is counted once
    size, height = bounds._measure_py(nested, None, None)
    assert height == 21  # the array and 20 lists
    assert 5000 < size < 6000  # the 5000-byte array once, not twice
    for sample in (nested, (nested,)):
        with pytest.raises(SampleTooDeepError):
            bounds.check_sample(sample, "f.pkl", 0, None, 10)
        with pytest.raises(SampleTooLargeError):
            bounds.check_sample(sample, "f.pkl", 0, 4000, None)
        bounds.check_sample(sample, "f.pkl", 0, 6000, 30)
