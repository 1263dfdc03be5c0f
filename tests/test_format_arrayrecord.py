"""The ArrayRecord format: the shared kit, and the output read back by array_record and grain."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pickleshard.cli import main
from pickleshard.errors import ConvertedDatasetError
from pickleshard.formats import open_dataset
from pickleshard.formats.arrayrecord import decode_record, encode_record
from pickleshard.pipelines.convert.run import convert
from pickleshard.testing import FormatTests, assert_same, oracle_samples, write_files

pytest.importorskip("array_record")


class TestArrayRecordFormat(FormatTests):
    format = "arrayrecord"


def _plain_decode(record: bytes) -> tuple[Any, ...]:
    """The record encoding as docs/formats.md gives it: numpy alone, no pickleshard."""
    f = io.BytesIO(record)
    kinds = np.load(f, allow_pickle=False)
    values = []
    for kind in kinds.tolist():
        a = np.load(f, allow_pickle=False)
        assert kind in (0, 1, 2), "only arrays, numpy scalars and ints here"
        values.append(a if kind == 0 else a[()] if kind == 1 else int(a))
    return tuple(values)


def _source(tmp_path: Path, n: int = 12) -> list[Any]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(n)]
    ys = [int(k) for k in rng.integers(0, 10, n)]
    half = n // 2
    paths = write_files(tmp_path / "src", [(xs[:half], ys[:half]), (xs[half:], ys[half:])])
    return oracle_samples(paths)


def test_grain_map_dataset_over_array_record_equals_pickle_load(tmp_path: Path) -> None:
    grain = pytest.importorskip("grain")
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    want = _source(tmp_path)
    out = tmp_path / "out"
    assert (
        main(["convert", str(tmp_path / "src"), str(out), "--to", "arrayrecord", "--jobs", "2"])
        == 0
    )
    files = sorted(str(p) for p in out.glob("*.array_record"))
    assert len(files) == 2
    source = ArrayRecordDataSource(files)
    ds = grain.MapDataset.source(source).map(_plain_decode)
    assert len(ds) == len(want)
    for i in range(len(want)):
        assert_same(ds[i], want[i], f"sample {i}")
    shuffled = grain.MapDataset.source(source).shuffle(seed=3).map(_plain_decode).batch(5)
    seen = [int(y) for batch in shuffled for y in batch[1]]
    assert sorted(seen) == sorted(int(y) for _, y in want)


_DTYPES = st.sampled_from(
    [
        "?",
        "i1",
        "u1",
        ">i2",
        "<u4",
        "<i8",
        ">u8",
        "<f2",
        ">f4",
        "<f8",
        "<c8",
        "<M8[ns]",
        "<U3",
        "S2",
    ]
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dtype=_DTYPES,
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    n=st.integers(1, 4),
    data=st.data(),
)
def test_array_record_reads_every_dtype_and_shape(
    tmp_path_factory: pytest.TempPathFactory,
    dtype: str,
    shape: tuple[int, ...],
    n: int,
    data: st.DataObject,
) -> None:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    tmp = tmp_path_factory.mktemp("hyp")
    xs = [data.draw(hnp.arrays(np.dtype(dtype), shape)) for _ in range(n)]
    path = tmp / "src" / "a.pkl"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps((xs, list(range(n))), protocol=5))
    with open(path, "rb") as fh:
        want = list(zip(*pickle.load(fh), strict=True))
    convert(tmp / "src", tmp / "out", to="arrayrecord", jobs=1)
    source = ArrayRecordDataSource(sorted(str(p) for p in (tmp / "out").glob("*.array_record")))
    for i in range(n):
        assert_same(_plain_decode(source[i]), want[i], f"sample {i}")
    ds = open_dataset(tmp / "out")
    for i, sample in enumerate(ds.__getitems__(list(range(n))[::-1])):
        assert_same(sample, want[n - 1 - i], f"sample {n - 1 - i}")


def test_record_round_trip_of_every_kind() -> None:
    values = (
        np.arange(6, dtype=">i4").reshape(2, 3),
        np.float32(1.5),
        7,
        2.5,
        True,
        "héllo",
        "nul\x00",
        b"\x00b",
        None,
        2**70,
        {"k": [1]},
        np.array([1, "a"], dtype=object),
    )
    back = decode_record(encode_record(values), len(values))
    for got, want in zip(back, values, strict=True):
        assert_same(got, want, repr(want))
    with pytest.raises(ValueError, match="expected"):
        decode_record(encode_record(values), 3)


def test_a_shard_with_other_counts_is_refused_naming_it(tmp_path: Path) -> None:
    _source(tmp_path)
    out = tmp_path / "out"
    convert(tmp_path / "src", out, to="arrayrecord")
    first = sorted(out.glob("*.array_record"))[0]
    first.write_bytes(sorted(out.glob("*.array_record"))[1].read_bytes()[:10])
    with pytest.raises(ConvertedDatasetError) as info:
        open_dataset(out)
    assert first.name in str(info.value)
