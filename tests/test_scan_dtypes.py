"""The one dtype codec (``pickleshard.scan.dtypes``): every dtype survives a JSON round trip,
and the formats read it back with it (structured dtypes with titles or sub-array fields used to
fail in ``formats.columns``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pickleshard.formats import open_dataset
from pickleshard.pipelines.convert.run import convert
from pickleshard.scan.dtypes import MAX_DEPTH, dtype_from_json, dtype_to_json
from pickleshard.testing import assert_same, oracle_samples, write_files

_ORDERED = ("f2", "f4", "f8", "i2", "i4", "i8", "u2", "u8", "c8", "c16", "U3", "M8[ns]", "m8[s]")
_UNORDERED = ("u1", "i1", "b1", "S5", "V3")

_scalars = st.one_of(
    st.tuples(st.sampled_from("<>="), st.sampled_from(_ORDERED)).map(
        lambda t: np.dtype(t[0] + t[1])
    ),
    st.sampled_from(_UNORDERED).map(np.dtype),
)
_names = st.text(
    st.characters(min_codepoint=ord("a"), max_codepoint=ord("z")), min_size=1, max_size=6
)
_shapes = st.none() | st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple)


def _structured(children: st.SearchStrategy[np.dtype[Any]]) -> st.SearchStrategy[np.dtype[Any]]:
    field = st.tuples(_names, children, st.booleans(), _shapes)
    fields = st.lists(field, min_size=1, max_size=4, unique_by=lambda f: f[0])
    return st.tuples(fields, st.booleans()).map(_build)


def _build(args: tuple[list[tuple[str, Any, bool, Any]], bool]) -> np.dtype[Any]:
    fields, align = args
    spec = []
    for name, sub, titled, shape in fields:
        key = ("T" + name.upper(), name) if titled else name  # titles never equal a name
        spec.append((key, sub) if shape is None else (key, sub, shape))
    return np.dtype(spec, align=align)


_dtypes = st.recursive(_scalars, _structured, max_leaves=12)
_structs = _structured(_dtypes)


def _round_trip(dtype: np.dtype[Any]) -> np.dtype[Any]:
    return dtype_from_json(json.loads(json.dumps(dtype_to_json(dtype))))


def _same(got: np.dtype[Any], want: np.dtype[Any]) -> None:
    assert got == want
    assert got.itemsize == want.itemsize
    assert got.descr == want.descr  # byte orders, titles, offsets and sub-arrays, all the way down
    assert got.names == want.names
    if want.fields is not None:
        assert got.fields is not None
        for name, info in want.fields.items():
            assert got.fields[name][1:] == info[1:]  # offset and title
            _same(got.fields[name][0], info[0])
    if want.subdtype is not None:
        assert got.subdtype is not None
        assert got.subdtype[1] == want.subdtype[1]
        _same(got.subdtype[0], want.subdtype[0])


@settings(max_examples=200, deadline=None)
@given(_dtypes)
def test_every_dtype_survives_a_json_round_trip(dtype: np.dtype[Any]) -> None:
    _same(_round_trip(dtype), dtype)


@settings(max_examples=60, deadline=None)
@given(_structs)
def test_structured_arrays_keep_their_bytes_through_the_codec(dtype: np.dtype[Any]) -> None:
    data = np.random.default_rng(0).integers(0, 256, 3 * dtype.itemsize, np.uint8).tobytes()
    want = np.frombuffer(data, dtype, count=3)
    got = np.frombuffer(data, _round_trip(dtype), count=3)
    assert got.tobytes() == want.tobytes()
    assert got.dtype.names == want.dtype.names


_TITLED = np.dtype([(("the title", "a"), "<f4"), ("b", ">i2")])
_SUBARRAY_NESTED = np.dtype([("n", [("x", ">f8", (2,)), ("y", "u1")]), ("z", "<i4", (2, 3))])


@pytest.mark.parametrize("dtype", [_TITLED, _SUBARRAY_NESTED], ids=["titles", "nested_subarray"])
def test_titles_and_nested_sub_arrays_read_back(dtype: np.dtype[Any]) -> None:
    _same(_round_trip(dtype), dtype)


def test_memmap_keeps_structured_fields_with_titles_and_sub_arrays(tmp_path: Path) -> None:
    """The defect: the memmap format wrote these dtypes and could not read them back (ragged
    fields, whose dtype is read from the descriptor, and columns merged from several parts)."""
    rng = np.random.default_rng(1)

    def arrays(dtype: np.dtype[Any], sizes: list[int]) -> list[np.ndarray]:
        return [rng.integers(0, 256, n * dtype.itemsize, np.uint8).view(dtype) for n in sizes]

    objects = [
        (arrays(_TITLED, [1, 3, 2]), arrays(_SUBARRAY_NESTED, [2, 1, 4])),
        (arrays(_TITLED, [4, 1]), arrays(_SUBARRAY_NESTED, [3, 3])),
    ]
    paths = write_files(tmp_path / "src", objects)
    convert(tmp_path / "src", tmp_path / "out", to="memmap", jobs=2)
    got = open_dataset(tmp_path / "out")
    want = oracle_samples(paths)
    assert len(got) == len(want)
    for i, sample in enumerate(want):
        assert_same(tuple(got[i]), sample, f"sample {i}")


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (5, "a string or a list of fields"),
        ([["a"]], "field entry"),
        ([[1, "<f4"]], "field name"),
        ([[["t", "a", "b"], "<f4"]], "field name"),
        ([["a", "<f4", "2"]], "sub-array shape"),
        ([["a", "<f4", [-1]]], "sub-array shape"),
        ([["a", "<f4", [True]]], "sub-array shape"),
        ("not a dtype", "not a dtype descr"),
        ([["a", {"b": 1}]], "a string or a list of fields"),
    ],
)
def test_what_is_not_a_descr_is_a_value_error(stored: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dtype_from_json(stored)


def test_nesting_is_bounded() -> None:
    deep: Any = "<f4"
    for _ in range(MAX_DEPTH + 2):
        deep = [["a", deep]]
    with pytest.raises(ValueError, match="nested deeper"):
        dtype_from_json(deep)
    shallow: Any = "<f4"
    for _ in range(MAX_DEPTH):
        shallow = [["a", shallow]]
    assert dtype_from_json(shallow).itemsize == 4
