"""The Parquet and Arrow rows of ``python -m bench.convert`` (issue 17).

Conversion: ``pickleshard.pipelines.convert.run`` to ``parquet`` and ``arrow`` against the naive loop (load
each pickle whole, build a ``pyarrow`` table of fixed-size lists, ``pq.ParquetWriter`` /
``pa.ipc.new_stream``). Shuffled epoch: pickleshard's reader (``open_dataset``) of each output
and HF ``datasets`` on the same files (``Dataset.from_parquet`` / ``Dataset.from_file``,
``with_format("numpy")``, read a batch at a time as a careful user would: ``ds[indices]``), in
the same DataLoader loop as the memmap rows, so the figures compare with raw ``np.memmap``.
HF's cache goes to a folder under the work directory, offline.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from pickleshard.formats import open_dataset
from pickleshard.pipelines.convert.run import convert

__all__ = ["NAMES", "arrow_conversions", "arrow_reads"]

#: the output directories this module writes under the work directory
NAMES = ("parquet", "arrow", "naive-parquet", "naive-arrow")


def _table(paths: Sequence[Path]) -> Any:
    import pyarrow as pa

    for path in paths:
        with open(path, "rb") as fh:
            xs, ys = pickle.load(fh)
        x = np.stack(xs)
        col = pa.array(x.reshape(-1))
        for n in reversed(x.shape[1:]):
            col = pa.FixedSizeListArray.from_arrays(col, n)
        yield pa.table({"x": col, "y": pa.array(ys, pa.int64())})


def naive_parquet(paths: Sequence[Path], out: Path) -> None:
    import pyarrow.parquet as pq

    out.mkdir(parents=True)
    writer = None
    for table in _table(paths):
        if writer is None:
            writer = pq.ParquetWriter(out / "data.parquet", table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()


def naive_arrow(paths: Sequence[Path], out: Path) -> None:
    import pyarrow as pa

    out.mkdir(parents=True)
    writer = None
    with pa.OSFile(str(out / "data.arrow"), "wb") as sink:
        for table in _table(paths):
            if writer is None:
                writer = pa.ipc.new_stream(sink, table.schema)
            writer.write_table(table)
        if writer is not None:
            writer.close()


def arrow_conversions(
    directory: Path, paths: Sequence[Path], work: Path, jobs: int
) -> list[tuple[str, Callable[[], Any]]]:
    """The conversion rows: (name, what to time)."""
    return [
        ("naive Parquet: load + pq.ParquetWriter", lambda: naive_parquet(paths, work / "naive-parquet")),
        (f"pickleshard Parquet, jobs={jobs}", lambda: convert(directory, work / "parquet", to="parquet", jobs=jobs)),
        ("naive Arrow: load + ipc.new_stream", lambda: naive_arrow(paths, work / "naive-arrow")),
        (f"pickleshard Arrow, jobs={jobs}", lambda: convert(directory, work / "arrow", to="arrow", jobs=jobs)),
    ]  # fmt: skip


class HfTuples(Dataset[Any]):
    """An HF dataset (numpy format) as ``(x, y)`` samples; ``__getitems__`` reads one slice."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Any:
        row = self.ds[int(i)]
        return row["x"], int(row["y"])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        batch = self.ds[list(indices)]
        return list(zip(batch["x"], batch["y"].tolist(), strict=True))


class HfArrowViews(HfTuples):
    """An HF dataset in ``with_format("arrow")``: a batch is a table; ``x`` a numpy view of it."""

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        table = self.ds[list(indices)]
        x = table.column("x").combine_chunks()
        while x.type.num_fields:  # fixed-size lists down to their numbers
            x = x.flatten()
        shape = self.shape
        return list(
            zip(x.to_numpy().reshape(-1, *shape), table.column("y").to_pylist(), strict=True)
        )

    @property
    def shape(self) -> tuple[int, ...]:
        t, dims = self.ds.features["x"], []
        while hasattr(t, "length"):
            dims.append(t.length)
            t = t.feature
        return tuple(dims)


def _hf(work: Path, kind: str, how: str = "numpy") -> HfTuples:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    cache = str(work / "hf-cache")
    if kind == "parquet" and how == "array3d":
        x = open_dataset(work / "parquet")[0][0]
        features = datasets.Features(
            {"x": datasets.Array3D(x.shape, str(x.dtype)), "y": datasets.Value("int64")}
        )
        path = str(work / "parquet" / "data.parquet")
        ds = datasets.Dataset.from_parquet(path, features=features, cache_dir=cache + "-3d")
    elif kind == "parquet":
        ds = datasets.Dataset.from_parquet(str(work / "parquet" / "data.parquet"), cache_dir=cache)
    else:
        ds = datasets.Dataset.from_file(str(work / "arrow" / "data.arrow"))
    ds = ds.select_columns(["x", "y"])
    if how == "arrow":
        return HfArrowViews(ds.with_format("arrow"))
    return HfTuples(ds.with_format("numpy"))


def arrow_reads(
    work: Path, map_epoch: Callable[[Any], Callable[[], int]]
) -> list[tuple[str, Callable[[], int]]]:
    """The shuffled-epoch rows: (name, one epoch returning the samples seen)."""
    return [
        ("pickleshard Parquet (open_dataset)", map_epoch(open_dataset(work / "parquet"))),
        ("pickleshard Arrow (open_dataset)", map_epoch(open_dataset(work / "arrow"))),
        ('HF datasets from_parquet, with_format("numpy"), ds[batch]', map_epoch(_hf(work, "parquet"))),
        ('HF datasets from_file (Arrow), with_format("numpy"), ds[batch]', map_epoch(_hf(work, "arrow"))),
        ('HF datasets from_parquet(features=Array3D), with_format("numpy"), ds[batch]', map_epoch(_hf(work, "parquet", "array3d"))),
        ('HF datasets from_file (Arrow), with_format("arrow") + numpy view, ds[batch]', map_epoch(_hf(work, "arrow", "arrow"))),
    ]  # fmt: skip
