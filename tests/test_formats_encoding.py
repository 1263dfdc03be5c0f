"""The safe value encoding: round trips (Hypothesis), exact digests, and bad bytes."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pickleshard.formats.encoding import (
    MAX_TEXT_INT_BITS,
    MemberKind,
    decode_member,
    decode_npy,
    decode_pss,
    encode_member,
    encode_pss,
    is_json_exact,
    sample_digest,
)
from pickleshard.testing import assert_same

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


@settings(max_examples=150, deadline=None)
@given(VALUES)
def test_pss_round_trips_exactly(value: Any) -> None:
    assert_same(decode_pss(encode_pss(value)), value)


@settings(max_examples=150, deadline=None)
@given(VALUES)
def test_members_round_trip_exactly(value: Any) -> None:
    kind, data = encode_member(value)
    assert_same(decode_member(kind, data), value)


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
        ({"a": [1, 2.5, None, True]}, MemberKind.JSON),
        ("text", MemberKind.JSON),
        ((1, 2), MemberKind.PSS),
        ({1: "int key"}, MemberKind.PSS),
        (b"bytes", MemberKind.PSS),
        (np.array([1, None], dtype=object), MemberKind.PSS),
    ],
)
def test_member_kinds(value: Any, kind: MemberKind) -> None:
    assert encode_member(value)[0] == kind


@pytest.mark.parametrize("bits", [MAX_TEXT_INT_BITS, MAX_TEXT_INT_BITS + 1, 16_000_000])
def test_ints_of_any_size_round_trip(bits: int) -> None:
    # past MAX_TEXT_INT_BITS decimal text is not safe to read back (int()'s digit limit): PSS
    text_kind = bits <= MAX_TEXT_INT_BITS
    top = (1 << bits) - 1  # exactly `bits` bits
    for value in (top, -top, [top], {"k": -top}):
        kind, data = encode_member(value)
        assert (kind != MemberKind.PSS) == text_kind
        assert decode_member(kind, data) == value


def test_json_exactness() -> None:
    assert is_json_exact({"a": [1, "b", None, 2.5, False]})
    assert not is_json_exact({"a": (1, 2)})
    assert not is_json_exact({1: "x"})
    assert not is_json_exact(np.float64(1))


def test_digests_tell_types_apart() -> None:
    values = [1, 1.0, True, np.int64(1), np.array(1), np.array([1]), "1", b"1", [1], (1,), {1}]
    digests = {sample_digest((v,)) for v in values}
    assert len(digests) == len(values)


def test_digests_ignore_memory_layout() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert sample_digest((a.T,)) == sample_digest((np.ascontiguousarray(a.T),))
    assert sample_digest((a[:, ::2],)) == sample_digest((a[:, ::2].copy(),))


def test_digests_of_equal_sets_do_not_depend_on_insertion_order() -> None:
    assert sample_digest(({"b", "a", "c"},)) == sample_digest(({"c", "b", "a"},))


@pytest.mark.parametrize("value", [object(), Fraction(1, 3), np.zeros(2, dtype=[("o", object)])])
def test_unencodable_values_raise_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match=r"cannot encode|object fields"):
        encode_pss(value)


@settings(max_examples=100, deadline=None)
@given(VALUES, st.data())
def test_damaged_bytes_raise_value_error_only(value: Any, data: st.DataObject) -> None:
    blob = bytearray(encode_pss(value))
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError: the reader re-raises it with context
        decode_pss(bytes(blob[:cut]))
    at = data.draw(st.integers(0, len(blob) - 1))
    blob[at] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(ValueError):  # damaged bytes may still decode, to something else
        decode_pss(bytes(blob))


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
