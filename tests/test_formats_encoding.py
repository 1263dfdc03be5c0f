"""The plain value encodings: round trips (Hypothesis), decoding with plain libraries, exact
digests, the unpickling policy, and bad bytes."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pickleshard.errors import UnsafePickleError
from pickleshard.formats.encoding import (
    MAX_TEXT_INT_BITS,
    MemberKind,
    decode_member,
    decode_npy,
    encode_member,
    is_json_exact,
    kind_of_ext,
    sample_digest,
)
from pickleshard.safety import UnpicklePolicy
from pickleshard.testing import assert_same
from pickleshard.testing.formats import Unpicklable

DOCS = Path(__file__).resolve().parents[1] / "docs" / "formats.md"

_DTYPES = st.sampled_from(
    ["bool", "i1", "i2", "<i4", ">i8", "u1", "u2", "u4", "u8", "f2", "f4", ">f8", "c8", "c16",
     "M8[ns]", "m8[s]", "U3", "S2"]
)  # fmt: skip
ARRAYS = hnp.arrays(_DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
SCALARS = ARRAYS.filter(lambda a: a.size > 0).map(lambda a: a.reshape(-1)[0])
HASHABLE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.binary(max_size=8)
)
LEAVES = st.one_of(
    HASHABLE,
    st.floats(allow_nan=True),
    st.complex_numbers(allow_nan=False),
    st.integers(min_value=-(2**100), max_value=2**100),
    ARRAYS,
    SCALARS,
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(HASHABLE, inner, max_size=4),
        st.dictionaries(st.text(max_size=4), inner, max_size=4).map(OrderedDict),
        st.sets(HASHABLE, max_size=4),
        st.frozensets(st.integers(), max_size=4),
        st.binary(max_size=8).map(bytearray),
    ),
    max_leaves=12,
)


def _plain_decode() -> Callable[[str, bytes], Any]:
    """``decode(ext, bytes)`` of docs/formats.md's plain LMDB reader: numpy, json, pickle only."""
    block = re.search(r"```python\n(import io, json, pickle\n.*?)```", DOCS.read_text(), re.S)
    assert block is not None
    scope: dict[str, Any] = {}
    exec(block.group(1).split("def read_sample")[0], scope)
    return scope["decode"]  # type: ignore[no-any-return]


@settings(max_examples=150, deadline=None)
@given(VALUES)
def test_members_round_trip_exactly(value: Any) -> None:
    kind, data = encode_member(value)
    assert_same(decode_member(kind, data), value)
    assert kind_of_ext(kind.ext) is kind


@settings(max_examples=150, deadline=None)
@given(VALUES)
def test_plain_libraries_decode_every_member_by_its_extension(value: Any) -> None:
    kind, data = encode_member(value)
    assert_same(_plain_decode()(kind.ext, data), value)


@settings(max_examples=100, deadline=None)
@given(ARRAYS)
def test_npy_members_are_what_np_save_writes(arr: np.ndarray[Any, Any]) -> None:
    import io

    kind, data = encode_member(arr)
    assert kind == MemberKind.NPY
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    assert data == buf.getvalue()
    assert_same(decode_npy(data), arr)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (np.zeros(3), MemberKind.NPY),
        (np.int16(3), MemberKind.SCALAR),
        (7, MemberKind.CLS),
        (-(2**80), MemberKind.CLS),
        ("text", MemberKind.TXT),
        ("lone \ud800", MemberKind.PICKLE),
        ({"a": [1, 2.5, None, True]}, MemberKind.JSON),
        (2.5, MemberKind.JSON),
        (None, MemberKind.JSON),
        ((1, 2), MemberKind.PICKLE),
        ({1: "int key"}, MemberKind.PICKLE),
        (b"bytes", MemberKind.PICKLE),
        (np.array([1, None], dtype=object), MemberKind.PICKLE),
        (Fraction(1, 3), MemberKind.PICKLE),
    ],
)
def test_member_kinds(value: Any, kind: MemberKind) -> None:
    assert encode_member(value)[0] == kind


@pytest.mark.parametrize("bits", [MAX_TEXT_INT_BITS, MAX_TEXT_INT_BITS + 1, 16_000_000])
def test_ints_of_any_size_round_trip(bits: int) -> None:
    # past MAX_TEXT_INT_BITS decimal text is not safe to read back (int()'s digit limit): pickle
    text_kind = bits <= MAX_TEXT_INT_BITS
    top = (1 << bits) - 1  # exactly `bits` bits
    for value in (top, -top, [top], {"k": -top}):
        kind, data = encode_member(value)
        assert (kind != MemberKind.PICKLE) == text_kind
        assert decode_member(kind, data) == value


def test_json_exactness() -> None:
    assert is_json_exact({"a": [1, "b", None, 2.5, False]})
    assert not is_json_exact({"a": (1, 2)})
    assert not is_json_exact({1: "x"})
    assert not is_json_exact(np.float64(1))


def test_pickled_members_load_under_the_policy() -> None:
    kind, data = encode_member(Fraction(1, 3))
    with pytest.raises(UnsafePickleError, match=r"fractions\.Fraction") as info:
        decode_member(kind, data, path="out", sample=4)
    assert info.value.sample == 4
    allowed = UnpicklePolicy.from_args(allow_globals=["fractions.Fraction"])
    assert decode_member(kind, data, allowed) == Fraction(1, 3)
    assert decode_member(kind, data, UnpicklePolicy(trusted=True)) == Fraction(1, 3)


def test_digests_tell_types_and_values_apart() -> None:
    values = [1, 1.0, True, np.int64(1), np.array(1), np.array([1]), "1", b"1", [1], (1,), {1}]
    values += [Fraction(1, 3), Fraction(2, 3), np.array([1, "a"], dtype=object)]
    digests = {sample_digest((v,)) for v in values}
    assert len(digests) == len(values)


def test_digests_ignore_memory_layout() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert sample_digest((a.T,)) == sample_digest((np.ascontiguousarray(a.T),))
    assert sample_digest((a[:, ::2],)) == sample_digest((a[:, ::2].copy(),))


def test_digests_of_equal_sets_do_not_depend_on_insertion_order() -> None:
    assert sample_digest(({"b", "a", "c"},)) == sample_digest(({"c", "b", "a"},))


@pytest.mark.parametrize("value", [Unpicklable(), lambda: 1, [Unpicklable()]])
def test_values_pickle_refuses_raise_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match=r"cannot store a value of type .*pickle refuses it"):
        encode_member(value)
    with pytest.raises(TypeError, match=r"cannot store"):
        sample_digest((value,))


@settings(max_examples=100, deadline=None)
@given(VALUES, st.data())
def test_truncated_members_raise_value_error_only(value: Any, data: st.DataObject) -> None:
    kind, blob = encode_member(value)
    assume(len(blob) > 0)  # an empty member ("" as txt) has nothing to cut
    cut = data.draw(st.integers(0, len(blob) - 1))
    if kind in (MemberKind.NPY, MemberKind.SCALAR, MemberKind.PICKLE):
        with pytest.raises(ValueError):  # noqa: PT011 - any ValueError: the reader re-raises it with context
            decode_member(kind, blob[:cut])


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x93NUMPY",
        b"\x93NUMPY\x09\x00",
        b"not npy at all",
        b"\x93NUMPY\x01\x00\x10\x00{'descr': '|O'",
    ],
)
def test_bad_npy_bytes_raise_value_error(blob: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        decode_npy(blob)
