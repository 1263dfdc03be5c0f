"""The loaders a user would pick instead of pickleshard, each reading its own tool's output.

Each is imported only here, lazily; a peer that is not installed raises
:class:`~bench.suite.loaders.Unavailable` with the install command.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset, SequentialSampler

from .loaders import Loader, Tuples, Unavailable, _random
from .plan import RowSpec

__all__ = ["open_peer"]

INSTALL = {
    "litdata": "pip install litdata",
    "mosaic": "pip install mosaicml-streaming",
    "hf": "pip install datasets",
    "lance-plain": "pip install pylance",
    "grain": "pip install grain array-record",
}


class _LanceBatchesAsSamples(IterableDataset[tuple[Any, Any]]):
    """``lance.torch.data.LanceDataset``'s batches (a fixed-shape tensor comes as ``(B, size)``)
    as ``(x, y)`` samples, ``x`` in its shape; its own order (a scan: it has no global shuffle)."""

    def __init__(self, uri: str, batch_size: int, shape: tuple[int, ...] | None) -> None:
        self.uri, self.batch_size, self.shape = uri, batch_size, shape

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        from lance.torch.data import LanceDataset

        ds = LanceDataset(self.uri, batch_size=self.batch_size, columns=["x", "y"])
        for batch in ds:
            xs = batch["x"] if self.shape is None else batch["x"].reshape(-1, *self.shape)
            yield from zip(xs, batch["y"].tolist(), strict=True)


class _GrainSamples(Dataset[tuple[Any, Any]]):
    """grain's ``MapDataset`` (globally shuffled, records decoded with numpy) as a map-style
    dataset read in its own order: the loop's sequential sampler walks grain's permutation."""

    def __init__(self, files: list[str], seed: int) -> None:
        import grain
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        source = ArrayRecordDataSource(files)
        self.ds = grain.MapDataset.source(source).shuffle(seed=seed).map(_npy_record)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self.ds[i]  # type: ignore[no-any-return]


# a record's field by its kind, as a grain user decodes one (the table of
# pickleshard.formats.arrayrecord; kind 7 is the user's own pickle of a dict or list)
_BY_KIND = (
    lambda a: a,
    lambda a: a[()],
    int,
    float,
    bool,
    str,
    lambda a: a.tobytes(),
    lambda a: pickle.loads(a.tobytes()),
)


def _npy_record(record: bytes) -> tuple[Any, ...]:
    """A pickleshard ArrayRecord record decoded with numpy (docs/formats.md)."""
    f = io.BytesIO(record)
    kinds = np.load(f, allow_pickle=False)
    return tuple(_BY_KIND[k](np.load(f, allow_pickle=False)) for k in kinds.tolist())


class _DictsAsTuples(IterableDataset[tuple[Any, Any]]):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for row in self.inner:
            yield row["x"], row["y"]


def open_peer(spec: RowSpec, prep: Path) -> Loader:
    try:
        if spec.loader == "litdata":
            import litdata

            ds = litdata.StreamingDataset(str(prep / "data"), shuffle=True, seed=spec.seed)
            return Loader(_DictsAsTuples(ds), None, len(ds))
        if spec.loader == "mosaic":
            from .prepare import import_streaming

            ds = import_streaming()[0].StreamingDataset(
                local=str(prep / "data"),
                shuffle=True,
                shuffle_seed=spec.seed,
                batch_size=spec.batch_size,
            )
            return Loader(_DictsAsTuples(ds), None, len(ds))
        if spec.loader == "lance-plain":
            import lance

            uri = str(prep / "data")
            n = lance.dataset(uri).count_rows()
            x = json.loads((prep / "data" / "pickleshard.json").read_text())["fields"][0]
            shape = tuple(x["type"]["shape"]) if x["type"]["t"] == "array" else None
            ds = _LanceBatchesAsSamples(uri, spec.batch_size, shape)
            return Loader(ds, None, n, "LanceDataset scans in order: no global shuffle")
        if spec.loader == "grain":
            files = sorted(str(p) for p in (prep / "data").glob("*.array_record"))
            grain_ds = _GrainSamples(files, spec.seed)
            return Loader(grain_ds, SequentialSampler(grain_ds), len(grain_ds))
        if spec.loader == "hf":
            import datasets

            hf = datasets.load_from_disk(str(prep / "data")).with_format("numpy")
            ds = Tuples(hf)
            return Loader(ds, _random(ds, spec), len(ds))
    except ImportError as exc:
        raise Unavailable(f"cannot import {exc.name} ({exc}): {INSTALL[spec.loader]}") from None
    raise ValueError(f"no loader called {spec.loader!r}")
