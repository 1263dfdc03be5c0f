"""The Parquet and Arrow formats: the shared kit, the CLI option, the reader's checks, the docs."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard.cli import main
from pickleshard.errors import ConvertedDatasetError
from pickleshard.formats import open_dataset
from pickleshard.formats.arrow.read import TableDataset
from pickleshard.pipelines.convert.run import convert
from pickleshard.testing import FormatTests, assert_same, oracle_samples, write_files

pa = pytest.importorskip("pyarrow")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "formats-arrow.md"


class TestParquetFormat(FormatTests):
    format = "parquet"


class TestArrowFormat(FormatTests):
    format = "arrow"


def _source(tmp_path: Path, n: int = 10) -> list[Any]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(n)]
    return oracle_samples(write_files(tmp_path / "src", [(xs, list(range(n)))]))


@pytest.mark.parametrize("to", ["parquet", "arrow"])
def test_cli_row_group_rows(tmp_path: Path, to: str) -> None:
    want = _source(tmp_path)
    out = tmp_path / "out"
    assert (
        main(["convert", str(tmp_path / "src"), str(out), "--to", to, "--row-group-rows", "3"]) == 0
    )
    desc = json.loads((out / "pickleshard.json").read_text())
    assert (desc["row_group_rows"], desc["row_groups"]) == (3, 4)
    ds = open_dataset(out)
    for i, sample in enumerate(ds.__getitems__(list(range(10)))):
        assert_same(sample, want[i], f"sample {i}")


def test_parquet_row_groups_are_cached_within_budget(tmp_path: Path) -> None:
    want = _source(tmp_path)
    convert(tmp_path / "src", tmp_path / "out", to="parquet", row_group_rows=4)
    ds = open_dataset(tmp_path / "out")
    assert isinstance(ds, TableDataset)
    for i in range(10):
        assert_same(ds[i], want[i], f"sample {i}")
    assert (ds._table.get().cache.misses, ds._table.get().cache.hits) == (
        3,
        7,
    )  # each group decoded once
    small = TableDataset(ds.root, ds.descriptor, cache_bytes=1)
    for i in (0, 1, 0):
        small[i]
    assert (small._table.get().cache.misses, small._table.get().cache.held) == (
        3,
        0,
    )  # over budget: never kept


def test_a_batch_reads_cached_row_groups_before_it_evicts_them(tmp_path: Path) -> None:
    want = _source(tmp_path)
    convert(tmp_path / "src", tmp_path / "out", to="parquet", row_group_rows=2)
    probe = open_dataset(tmp_path / "out")
    assert isinstance(probe, TableDataset)
    probe[0]
    per_group = probe._table.get().cache.held
    # room for 3 of the 5 groups: a batch over all of them, twice
    ds = TableDataset(probe.root, probe.descriptor, cache_bytes=3 * per_group + per_group // 2)
    everything = list(range(10))
    ds.__getitems__(everything)
    assert (ds._table.get().cache.hits, ds._table.get().cache.misses) == (0, 5)
    got = ds.__getitems__(everything)
    assert (ds._table.get().cache.hits, ds._table.get().cache.misses) == (
        3,
        7,
    )  # groups 2-4 were still held
    for i, sample in enumerate(got):
        assert_same(sample, want[i], f"sample {i}")


def _damaged(tmp_path: Path, to: str, damage: Callable[[Path], None]) -> Path:
    _source(tmp_path)
    out = tmp_path / "out"
    convert(tmp_path / "src", out, to=to, row_group_rows=4)
    damage(out)
    return out


def _truncate(out: Path) -> None:
    for f in out.glob("data.*"):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _other_rows(out: Path) -> None:
    path = out / "pickleshard.json"
    desc = json.loads(path.read_text())
    desc["row_group_rows"] = 5
    path.write_text(json.dumps(desc))


def _no_column(out: Path) -> None:
    path = out / "pickleshard.json"
    desc = json.loads(path.read_text())
    desc["fields"][0]["column"] = "nope"
    path.write_text(json.dumps(desc))


def _no_type(out: Path) -> None:
    path = out / "pickleshard.json"
    desc = json.loads(path.read_text())
    del desc["fields"][1]["type"]
    path.write_text(json.dumps(desc))


@pytest.mark.parametrize("to", ["parquet", "arrow"])
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_truncate, "cannot open data"),
        (_other_rows, "row groups"),
        (_no_column, "no column"),
        (_no_type, "field entries are damaged"),
    ],
)
def test_damaged_outputs_are_refused_naming_the_file(
    tmp_path: Path, to: str, damage: Callable[[Path], None], message: str
) -> None:
    out = _damaged(tmp_path, to, damage)
    with pytest.raises(ConvertedDatasetError, match=message) as info:
        open_dataset(out)[0]
    assert str(out) in str(info.value)


def _retype(out: Path) -> None:
    path = out / "pickleshard.json"
    desc = json.loads(path.read_text())
    desc["fields"][0]["type"] = {"t": "pickle"}  # the x column does not hold pickles
    path.write_text(json.dumps(desc))


@pytest.mark.parametrize("to", ["parquet", "arrow"])
def test_a_column_of_another_type_is_refused_at_open(tmp_path: Path, to: str) -> None:
    out = _damaged(tmp_path, to, _retype)
    with pytest.raises(ConvertedDatasetError, match=r"column .x. of data.* holds fixed_size_list"):
        open_dataset(out)


def test_a_damaged_value_names_its_sample(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([(i, 7777) for i in range(10)], list(range(10)))])
    convert(tmp_path / "src", tmp_path / "out", to="arrow", row_group_rows=4)
    path = tmp_path / "out" / "data.arrow"
    data = path.read_bytes()
    tuple5 = pickle.dumps((5, 7777), protocol=5)
    assert data.count(tuple5) == 1
    path.write_bytes(data.replace(tuple5, tuple5[:-1] + b"X"))  # STOP is the last byte
    ds = open_dataset(tmp_path / "out")
    assert ds[4] == ((4, 7777), 4)
    with pytest.raises(
        ConvertedDatasetError, match=r"cannot decode field .x..*bad pickle member"
    ) as info:
        ds[5]
    assert info.value.sample == 5
