"""The memmap format: the shared kit, and plain ``np.load`` reading every layout it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard.errors import ConvertedDatasetError
from pickleshard.formats import open_dataset
from pickleshard.formats.columns import MAX_SEGMENTS
from pickleshard.formats.encoding import MemberKind
from pickleshard.pipelines.convert.run import convert
from pickleshard.testing import FormatTests, assert_same, oracle_samples, write_files


class TestMemmapFormat(FormatTests):
    format = "memmap"


def _convert(tmp_path: Path, objects: list[Any], **kwargs: Any) -> tuple[Path, list[Any]]:
    paths = write_files(tmp_path / "src", objects)
    convert(tmp_path / "src", tmp_path / "out", to="memmap", **kwargs)
    return tmp_path / "out", oracle_samples(paths)


def _kinds(out: Path) -> dict[str, str]:
    desc = json.loads((out / "pickleshard.json").read_text())
    return {f["name"]: f["kind"] for f in desc["fields"]}


def test_fixed_fields_are_one_plain_npy_each(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    objects = [
        ([rng.standard_normal((3, 4)).astype(np.float32) for _ in range(n)], [n] * n)
        for n in (4, 6)
    ]
    out, want = _convert(tmp_path, objects, jobs=2)
    assert _kinds(out) == {"x": "array", "y": "int"}
    x = np.load(out / "x.npy", mmap_mode="r")
    y = np.load(out / "y.npy", mmap_mode="r")
    assert isinstance(x, np.memmap)
    assert (x.shape, x.dtype, y.dtype) == ((10, 3, 4), np.float32, np.int64)
    for i, (xi, yi) in enumerate(want):
        assert np.array_equal(x[i], xi)
        assert int(y[i]) == yi


def test_ragged_field_is_values_offsets_shapes(tmp_path: Path) -> None:
    xs = [np.arange(n * 2, dtype=np.int32).reshape(n, 2) for n in (3, 0, 5, 1)]
    out, want = _convert(tmp_path, [(xs, [0, 1, 2, 3])])
    assert _kinds(out)["x"] == "ragged"
    values = np.load(out / "x.values.npy", mmap_mode="r")
    offsets = np.load(out / "x.offsets.npy")
    shapes = np.load(out / "x.shapes.npy")
    assert values.dtype == np.int32
    for i, (xi, _) in enumerate(want):
        assert np.array_equal(values[offsets[i] : offsets[i + 1]].reshape(shapes[i]), xi)


def test_object_field_is_kinds_values_offsets_with_json(tmp_path: Path) -> None:
    rows = [{"tokens": [1, 2], "text": "a"}, {"tokens": [], "text": "bé"}, None]
    out, want = _convert(tmp_path, [(rows, [0, 1, 2])])
    assert _kinds(out)["x"] == "object"
    kinds = np.load(out / "x.kinds.npy")
    values = np.load(out / "x.values.npy", mmap_mode="r")
    offsets = np.load(out / "x.offsets.npy")
    assert set(kinds.tolist()) == {MemberKind.JSON}
    for i, (xi, _) in enumerate(want):
        assert json.loads(values[offsets[i] : offsets[i + 1]].tobytes()) == xi


def test_types_changing_between_parts_become_object(tmp_path: Path) -> None:
    objects = [
        ([np.zeros(2, np.float32)] * 2, [1, 2]),
        ([np.zeros(2, np.float64)] * 2, ["three", "four"]),
    ]
    out, want = _convert(tmp_path, objects, jobs=2)
    assert _kinds(out) == {"x": "object", "y": "object"}
    ds = open_dataset(out)
    for i, sample in enumerate(want):
        assert_same(ds[i], sample, f"sample {i}")


def test_shapes_changing_between_parts_become_ragged(tmp_path: Path) -> None:
    objects = [([np.ones((2, 2))] * 3, [0, 1, 2]), ([np.ones((3, 3))] * 2, [3, 4])]
    out, want = _convert(tmp_path, objects, jobs=2)
    assert _kinds(out)["x"] == "ragged"
    ds = open_dataset(out)
    for i, sample in enumerate(want):
        assert_same(ds[i], sample, f"sample {i}")


def test_a_column_that_keeps_changing_type_is_capped_as_object(tmp_path: Path) -> None:
    ys: list[Any] = [k if k % 2 else str(k) for k in range(4 * MAX_SEGMENTS)]
    out, want = _convert(tmp_path, [(list(range(len(ys))), ys)])
    assert _kinds(out) == {"x": "int", "y": "object"}
    ds = open_dataset(out)
    for got, sample in zip(ds.__getitems__(list(range(len(ys)))), want, strict=True):
        assert_same(got, sample)


def test_python_floats_and_bools_and_numpy_scalars(tmp_path: Path) -> None:
    objects = [{"f": [0.5, float("inf")], "b": [True, False], "s": [np.float16(1), np.float16(2)]}]
    out, want = _convert(tmp_path, objects)
    assert _kinds(out) == {"f": "float", "b": "bool", "s": "scalar"}
    ds = open_dataset(out)
    for got, sample in zip(ds.__getitems__([0, 1]), want, strict=True):
        assert_same(got, sample)


def test_missing_field_file_is_a_clear_error(tmp_path: Path) -> None:
    out, _ = _convert(tmp_path, [([1, 2], [3, 4])])
    (out / "y.npy").unlink()
    with pytest.raises(ConvertedDatasetError) as info:
        open_dataset(out)
    assert str(out) in str(info.value)
    assert "y.npy" in str(info.value)


@pytest.mark.parametrize(
    ("descriptor", "message"),
    [
        (None, "no pickleshard.json"),
        ("{not json", "cannot read"),
        ('{"format": "x"}', "not a pickleshard"),
    ],
)
def test_not_a_conversion_is_a_clear_error(
    tmp_path: Path, descriptor: str | None, message: str
) -> None:
    if descriptor is not None:
        (tmp_path / "pickleshard.json").write_text(descriptor)
    with pytest.raises(ConvertedDatasetError, match=message):
        open_dataset(tmp_path)


def test_unknown_format_is_a_clear_error(tmp_path: Path) -> None:
    out, _ = _convert(tmp_path, [([1, 2], [3, 4])])
    desc = json.loads((out / "pickleshard.json").read_text())
    (out / "pickleshard.json").write_text(json.dumps({**desc, "to": "feather"}))
    with pytest.raises(ConvertedDatasetError, match="unknown format 'feather'"):
        open_dataset(out)


@pytest.mark.parametrize("version", [1, 99])
def test_another_version_names_the_fix_reconvert(tmp_path: Path, version: int) -> None:
    out, _ = _convert(tmp_path, [([1, 2], [3, 4])])
    desc = json.loads((out / "pickleshard.json").read_text())
    (out / "pickleshard.json").write_text(json.dumps({**desc, "version": version}))
    with pytest.raises(
        ConvertedDatasetError,
        match=rf"^.*pickleshard.json: convert the source "
        rf"again \(pickleshard convert SRC .*out --to memmap\): this output "
        rf"is version {version}, and this pickleshard reads version 2",
    ):
        open_dataset(out)
