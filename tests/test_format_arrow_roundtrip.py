"""Round trips through the Parquet and Arrow formats, ``pickle.load`` as the oracle (Hypothesis).

Columns are drawn either from the scanner tests' nested-value strategy (``picklegen.values``:
mostly mixed types, so mostly the pickle fallback) or homogeneous, so that every native column type
(ints with nulls, strings, lists, structs, fixed and ragged arrays, numpy scalars) is exercised.
The column-type layer is checked value by value in memory; whole conversions, fewer and slower,
go through ``convert`` and ``open_dataset``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from picklegen import ndarrays, values
from pickleshard.formats import open_dataset
from pickleshard.formats.arrow.columntypes import infer_type, merge_types
from pickleshard.formats.arrow.values import from_arrow, is_stacked, stack_values, to_arrow
from pickleshard.pipelines.convert.run import convert
from pickleshard.testing import assert_same, oracle_samples, write_files

pa = pytest.importorskip("pyarrow")

_NATIVE = st.sampled_from(["bool", "i1", "u2", "<i4", ">i8", "u8", "f2", "<f4", ">f8"])
_INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def _fixed_arrays(draw: st.DrawFn) -> list[Any]:
    dtype = draw(_NATIVE)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
    return draw(st.lists(hnp.arrays(dtype, shape), min_size=1, max_size=6))


@st.composite
def _ragged_arrays(draw: st.DrawFn) -> list[Any]:
    dtype = draw(_NATIVE)
    ndim = draw(st.integers(1, 3))
    shapes = hnp.array_shapes(min_dims=ndim, max_dims=ndim, min_side=0, max_side=3)
    return draw(st.lists(shapes.flatmap(lambda s: hnp.arrays(dtype, s)), min_size=1, max_size=6))


_RECORD = st.fixed_dictionaries(
    {"id": _INT64, "name": st.text(max_size=5), "tags": st.lists(st.text(max_size=3), max_size=3)}
)
COLUMNS = st.one_of(
    st.lists(values(arrays=True), min_size=1, max_size=6),
    st.lists(ndarrays(), min_size=1, max_size=4),
    st.lists(st.one_of(st.none(), _INT64), min_size=1, max_size=8),
    st.lists(st.floats(), min_size=1, max_size=8),
    st.lists(st.one_of(st.none(), st.text(max_size=6)), min_size=1, max_size=8),
    st.lists(st.binary(max_size=6), min_size=1, max_size=8),
    st.lists(st.lists(st.lists(_INT64, max_size=3), max_size=3), min_size=1, max_size=6),
    st.lists(st.one_of(st.none(), _RECORD), min_size=1, max_size=6),
    _fixed_arrays(),
    _ragged_arrays(),
    st.lists(hnp.from_dtype(np.dtype("f4")).map(np.float32), min_size=1, max_size=6),
)


def _pickled(column: list[Any]) -> list[Any]:
    """What pickle.load gives back for ``column`` (the oracle)."""
    return list(pickle.loads(pickle.dumps(column, protocol=5)))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(COLUMNS, st.integers(1, 4))
def test_column_types_round_trip_through_arrow_arrays(column: list[Any], chunk: int) -> None:
    want = _pickled(column)
    ct = None
    for v in want:
        ct = merge_types(ct, infer_type(v))
    assert ct is not None
    got: list[Any] = []
    for a in range(0, len(want), chunk):
        piece: Any = want[a : a + chunk]
        if is_stacked(ct):
            piece = stack_values(ct, piece)
        arrays = to_arrow(ct, piece)
        # through the IPC format, as a file would hold it
        batch = pa.record_batch(arrays, names=[f"c{k}" for k in range(len(arrays))])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        back = pa.ipc.open_stream(sink.getvalue()).read_next_batch()
        got += from_arrow(ct, list(back.columns), pickle.loads)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"value {i} of column type {ct}")


def test_native_types_are_chosen_where_arrow_has_them() -> None:
    def ct(*vals: Any) -> Any:
        out = None
        for v in vals:
            out = merge_types(out, infer_type(v))
        return out

    assert ct(1, None, 3) == {"t": "int", "null": True}
    assert ct(np.zeros((2, 3), np.float32))["t"] == "array"
    assert ct(np.zeros((2, 3)), np.zeros((1, 3)))["t"] == "ragged"
    assert ct({"a": 1, "b": "x"}, {"a": 2, "b": None})["t"] == "struct"
    assert ct([1, 2], [], [3])["t"] == "list"
    for mixed in [
        (1, 1.5),
        ({"a": 1}, {"b": 1}),
        ((1, 2),),
        ({1: 2},),
        (2**64,),
        ("\ud800",),
        ({},),
    ]:
        assert ct(*mixed)["t"] == "pickle", mixed
    assert ct(np.zeros(2, np.complex64))["t"] == "pickle"
    assert ct(np.array([2], np.uint8).view(np.bool_))["t"] == "pickle"  # not a canonical bool


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(st.tuples(COLUMNS, COLUMNS), min_size=1, max_size=2),
    st.sampled_from(["parquet", "arrow"]),
    st.integers(1, 5),
)
def test_conversions_equal_pickle_load(
    tmp_path_factory: pytest.TempPathFactory,
    files: list[tuple[list[Any], list[Any]]],
    to: str,
    rows: int,
) -> None:
    tmp = tmp_path_factory.mktemp("rt")
    objects = []
    for xs, ys in files:
        n = min(len(xs), len(ys))
        objects.append((xs[:n], ys[:n]))
    paths = write_files(tmp / "src", objects)
    want = oracle_samples(paths)
    convert(tmp / "src", tmp / "out", to=to, row_group_rows=rows, jobs=1, verify=True)
    ds = open_dataset(tmp / "out")
    assert len(ds) == len(want)
    for i, got in enumerate(ds.__getitems__(list(range(len(ds)))[::-1])[::-1]):
        assert_same(got, want[i], f"sample {i}")
    for i in range(len(ds)):
        assert_same(ds[i], want[i], f"sample {i}")


def test_row_group_rows_is_checked(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([1, 2], [3, 4])])
    with pytest.raises(ValueError, match="not 'memmap'"):
        convert(tmp_path / "src", tmp_path / "out", to="memmap", row_group_rows=8)
    with pytest.raises(ValueError, match=">= 1"):
        convert(tmp_path / "src", tmp_path / "out", to="parquet", row_group_rows=0)
