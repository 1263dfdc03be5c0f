"""The Lance format: the shared kit, and the output read back by pylance itself."""

from __future__ import annotations

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
from pickleshard.pipelines.convert.run import convert
from pickleshard.testing import FormatTests, assert_same, oracle_samples, write_files
from pickleshard.testing.formats import tree_bytes

lance = pytest.importorskip("lance")

_LANCE_OWN = ("_versions", "_transactions", "data")


class TestLanceFormat(FormatTests):
    format = "lance"
    worker_start = "spawn"  # Lance's runtime is not fork-safe: a forked reader is refused

    def output_contents(self, out: Path) -> Any:
        """Our files' bytes, and Lance's rows, schema and metadata. Not Lance's bytes: its file
        names are random, its manifest holds the time, and its data files' footers hold field
        metadata maps in hash order (a tensor column's two keys swap from run to run)."""
        ours = {k: v for k, v in tree_bytes(out).items() if k.split("/")[0] not in _LANCE_OWN}
        table = lance.dataset(str(out)).to_table()
        metadata = [table.schema.metadata, *[f.metadata for f in table.schema]]
        return ours, table, metadata


def _source(tmp_path: Path, n: int = 12) -> list[Any]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(n)]
    ys = [int(k) for k in rng.integers(0, 10, n)]
    half = n // 2
    paths = write_files(tmp_path / "src", [(xs[:half], ys[:half]), (xs[half:], ys[half:])])
    return oracle_samples(paths)


def test_cli_and_pylance_take_equal_pickle_load(tmp_path: Path) -> None:
    want = _source(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "src"), str(out), "--to", "lance", "--jobs", "2"]) == 0
    indices = [7, 0, 11, 3, 3]
    table = lance.dataset(str(out)).take(indices)
    xs = table.column("x").chunk(0).to_numpy_ndarray()
    ys = table.column("y").to_pylist()
    for k, i in enumerate(indices):
        assert_same(xs[k], want[i][0], f"x of sample {i}")
        assert ys[k] == want[i][1]


def test_lance_torch_dataset_equals_pickle_load(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from lance.torch.data import LanceDataset

    want = _source(tmp_path)
    convert(tmp_path / "src", tmp_path / "out", to="lance")
    seen = 0
    for batch in LanceDataset(str(tmp_path / "out"), batch_size=5, columns=["x", "y"]):
        xs = batch["x"].reshape(-1, 3, 4)  # a fixed-shape tensor comes as (batch, size)
        for k in range(len(xs)):
            x, y = want[seen + k]
            assert torch.equal(xs[k], torch.from_numpy(x))
            assert int(batch["y"][k]) == y
        seen += len(xs)
    assert seen == len(want)


_NATIVE = st.sampled_from(
    ["?", "i1", "u1", "<i2", ">i2", "<u4", "<i8", ">u8", "<f2", "<f4", ">f4", "<f8", ">f8"]
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dtype=_NATIVE,
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    n=st.integers(1, 5),
    data=st.data(),
)
def test_pylance_reads_every_dtype_and_shape(
    tmp_path_factory: pytest.TempPathFactory,
    dtype: str,
    shape: tuple[int, ...],
    n: int,
    data: st.DataObject,
) -> None:
    tmp = tmp_path_factory.mktemp("hyp")
    xs = [data.draw(hnp.arrays(np.dtype(dtype), shape)) for _ in range(n)]
    path = tmp / "src" / "a.pkl"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps((xs, list(range(n))), protocol=5))
    with open(path, "rb") as fh:
        want_x, _ = pickle.load(fh)
    convert(tmp / "src", tmp / "out", to="lance", jobs=1)
    got = lance.dataset(str(tmp / "out")).take(list(range(n))[::-1])
    col = got.column("x").chunk(0)
    if dtype == "?":  # Arrow's tensors hold numbers: bool arrays are nested fixed-size lists
        flat = col
        for _ in shape:
            flat = flat.flatten()
        got_x = flat.to_numpy(zero_copy_only=False).reshape(n, *shape)
    else:
        got_x = col.to_numpy_ndarray()
    for k, i in enumerate(range(n - 1, -1, -1)):
        # Arrow holds numbers little-endian: the values, not the byte order, are what survives
        assert got_x[k].shape == want_x[i].shape
        assert got_x[k].tobytes() == want_x[i].astype(want_x[i].dtype.newbyteorder("<")).tobytes()
    ds = open_dataset(tmp / "out")
    for i in range(n):
        assert_same(ds[i][0], want_x[i], f"sample {i}")


def test_dotted_and_ragged_fields_get_lance_column_names(tmp_path: Path) -> None:
    columns = {"a.b": [np.zeros((k, 2)) for k in (1, 3, 0)], "a_b": [1, 3, 0]}
    paths = write_files(tmp_path / "src", [columns])
    convert(tmp_path / "src", tmp_path / "out", to="lance")
    names = lance.dataset(str(tmp_path / "out")).schema.names
    assert names == ["a_b", "a_b_shape", "a_b_1"]
    ds = open_dataset(tmp_path / "out")
    for i, sample in enumerate(oracle_samples(paths)):
        assert_same(ds[i], sample, f"sample {i}")


def test_a_dataset_with_other_rows_is_refused_naming_it(tmp_path: Path) -> None:
    _source(tmp_path)
    out = tmp_path / "out"
    convert(tmp_path / "src", out, to="lance")
    lance.write_dataset(lance.dataset(str(out)).to_table().slice(0, 3), str(out), mode="append")
    with pytest.raises(ConvertedDatasetError, match="holds 15 rows, expected 12") as info:
        open_dataset(out)
    assert str(out) in str(info.value)


def test_a_forked_reader_is_refused_with_the_fix(tmp_path: Path) -> None:
    import os

    _source(tmp_path)
    convert(tmp_path / "src", tmp_path / "out", to="lance")
    ds = open_dataset(tmp_path / "out", shuffle=False)
    ds[0]  # Lance used here: a fork of this process must not read it (it would hang)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what reading gives, then leave without cleanup
        try:
            ds[1]
            text = "read"
        except ConvertedDatasetError as exc:
            text = str(exc)
        os.write(write, text.encode()[:4000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        message = fh.read().decode()
    os.waitpid(pid, 0)
    assert "multiprocessing_context='spawn'" in message
