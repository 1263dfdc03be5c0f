"""Parquet and Arrow outputs read by plain pyarrow, HF ``datasets`` and polars, without pickleshard.

The readers run in a subprocess where ``import pickleshard`` fails (``sys.modules`` blocks it)
and ``src`` is not on the path; they save what they read as ``.npy`` files, and this process
compares those with ``pickle.load`` of the source files. HF datasets runs offline with its
cache under ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard.pipelines.convert.run import convert
from pickleshard.testing import oracle_samples, write_files

pytest.importorskip("pyarrow")

N_FILES, PER_FILE = 3, 5

# Runs with pickleshard blocked: everything here is what a user without pickleshard writes.
_READER = r"""
import io, json, pickle, sys
sys.modules["pickleshard"] = None  # any import of pickleshard now raises ImportError
sys.path = [p for p in sys.path if not p.rstrip("/").endswith("src")]
import numpy as np

which, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
got = {}

def pickled(blob):
    # the fallback column holds one pickle (protocol 5) per row
    return pickle.loads(blob)

if which == "pyarrow":
    import pyarrow.parquet as pq
    t = pq.read_table(path)
    got["x"] = t.column("x").combine_chunks().flatten().flatten().to_numpy().reshape(len(t), 3, 4)
    got["y"] = t.column("y").to_numpy()
    r = t.column("r").combine_chunks()
    shapes = np.asarray(t.column("r.shape").combine_chunks().flatten()).reshape(len(t), 2)
    offsets = np.asarray(r.offsets)
    values = np.asarray(r.flatten())
    for i in range(len(t)):
        got[f"r{i}"] = values[offsets[i]:offsets[i + 1]].reshape(shapes[i])
        got[f"c{i}"] = pickled(t.column("c")[i].as_py())
    got["text"] = np.array(t.column("text").to_pylist())
    meta = json.loads(t.schema.metadata[b"pickleshard"])
    got["codec"] = np.array([f.get("codec", "") for f in meta["fields"]])
elif which == "hf":
    import datasets
    pq_path, arrow_path = path.split(",")
    for tag, ds in (
        ("hf-parquet", datasets.Dataset.from_parquet(pq_path, cache_dir=sys.argv[4])),
        ("hf-arrow", datasets.Dataset.from_file(arrow_path)),
    ):
        npds = ds.with_format("numpy")
        got[f"{tag}/x"] = npds["x"]
        got[f"{tag}/y"] = npds["y"]
        got[f"{tag}/x3"] = npds[3]["x"]
        # an empty list comes back as an empty int64 array: give it the feature's dtype
        r_dtype = np.dtype(ds.features["r"].feature.dtype)
        for i in range(len(ds)):
            got[f"{tag}/r{i}"] = npds[i]["r"].astype(r_dtype).reshape(npds[i]["r.shape"])
        tds = ds.with_format("torch")
        got[f"{tag}/x_torch"] = tds[:]["x"].numpy()
        got[f"{tag}/y_torch"] = tds[:]["y"].numpy()
        got[f"{tag}/text"] = np.array(ds["text"])
elif which == "polars":
    import polars as pl
    df = pl.read_parquet(path)
    got["x"] = df["x"].to_numpy()
    got["y"] = df["y"].to_numpy()
    got["text"] = np.array(df["text"].to_list())
assert not any(m == "pickleshard" or m.startswith("pickleshard.") for m in sys.modules if sys.modules[m] is not None)
np.savez(out, **got)
"""


def _source(tmp_path: Path) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(0)
    objects = []
    for f in range(N_FILES):
        n = PER_FILE
        objects.append(
            {
                "x": [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(n)],
                "y": [int(v) for v in rng.integers(0, 10, n)],
                "r": [np.arange(2 * k, dtype=np.int16).reshape(k, 2) for k in range(n)],
                "c": [np.array([1 + 2j, f + 0j], dtype=np.complex64) for _ in range(n)],
                "text": [f"sample {f}-{k} é" for k in range(n)],
            }
        )
    paths = write_files(tmp_path / "src", objects)
    # a dict of columns: samples are dicts; the checks below read their values by position
    return [tuple(s.values()) for s in oracle_samples(paths)]


def _read(which: str, path: Path, tmp_path: Path) -> dict[str, np.ndarray[Any, Any]]:
    out = tmp_path / f"{which}.npz"
    hf = tmp_path / "hf-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "HF_"))}
    env.update(
        HF_HOME=str(hf),
        HF_DATASETS_CACHE=str(hf),
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_DISABLE_PROGRESS_BARS="1",
    )
    proc = subprocess.run(
        [sys.executable, "-c", _READER, which, str(path), str(out), str(hf)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def _assert_exact(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.tobytes() == want.tobytes(), f"{what}: values differ"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[Any, ...]]]:
    tmp = tmp_path_factory.mktemp("plain")
    want = _source(tmp)
    convert(tmp / "src", tmp / "pq", to="parquet", row_group_rows=4, jobs=1)
    convert(tmp / "src", tmp / "arrow", to="arrow", row_group_rows=4, jobs=1)
    return tmp, want


def _check_common(got: dict[str, Any], want: list[tuple[Any, ...]], which: str) -> None:
    _assert_exact(got["x"], np.stack([s[0] for s in want]), f"{which} x")
    _assert_exact(got["y"], np.array([s[1] for s in want], dtype=np.int64), f"{which} y")
    assert got["text"].tolist() == [s[4] for s in want]


def test_pyarrow_read_table(converted: tuple[Path, list[tuple[Any, ...]]]) -> None:
    tmp, want = converted
    got = _read("pyarrow", tmp / "pq" / "data.parquet", tmp)
    _check_common(got, want, "pyarrow")
    for i, sample in enumerate(want):
        _assert_exact(got[f"r{i}"], sample[2], f"ragged r[{i}]")
        _assert_exact(got[f"c{i}"], sample[3], f"pickled c[{i}]")
    assert got["codec"].tolist() == ["", "", "", "pickle", ""]


@pytest.mark.slow
def test_hf_datasets_numpy_and_torch(converted: tuple[Path, list[tuple[Any, ...]]]) -> None:
    pytest.importorskip("datasets")
    tmp, want = converted
    both = f"{tmp / 'pq' / 'data.parquet'},{tmp / 'arrow' / 'data.arrow'}"
    read = _read("hf", Path(both), tmp)
    for which in ("hf-parquet", "hf-arrow"):
        got = {k.split("/", 1)[1]: v for k, v in read.items() if k.startswith(which + "/")}
        _check_common(got, want, which)
        _assert_exact(got["x3"], want[3][0], f"{which} row 3")
        _assert_exact(got["x_torch"], got["x"], f"{which} torch x")
        _assert_exact(got["y_torch"], got["y"], f"{which} torch y")
        for i, sample in enumerate(want):
            _assert_exact(got[f"r{i}"], sample[2], f"{which} ragged r[{i}]")
    assert (tmp / "hf-cache").is_dir()  # HF's cache stayed under tmp_path


def test_polars_read_parquet(converted: tuple[Path, list[tuple[Any, ...]]]) -> None:
    pytest.importorskip("polars")
    tmp, want = converted
    got = _read("polars", tmp / "pq" / "data.parquet", tmp)
    _check_common(got, want, "polars")


def test_descriptor_names_the_fallback_column(
    converted: tuple[Path, list[tuple[Any, ...]]],
) -> None:
    tmp, _ = converted
    desc = json.loads((tmp / "pq" / "pickleshard.json").read_text())
    by_name = {f["name"]: f for f in desc["fields"]}
    assert by_name["c"]["codec"] == "pickle"
    assert by_name["r"]["shape_column"] == "r.shape"
    assert by_name["x"]["arrow_type"] == "fixed_size_list<item: fixed_size_list<item: float>[4]>[3]"
    assert desc["row_group_rows"] == 4
    assert desc["row_groups"] == 4
