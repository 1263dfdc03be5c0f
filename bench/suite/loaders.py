"""Open one loader over a prepared dataset: what the row's DataLoader iterates.

:func:`open_loader` returns a :class:`Loader`: a dataset, the sampler the loader's own docs
recommend for a shuffled epoch (None for an iterable dataset that shuffles itself), and how many
samples the epoch covers. Every loader yields ``(x, y)`` samples, so one collate and one
consumption serve all rows. Peers (LitData, Mosaic Streaming, HF datasets) are in :mod:`.peers`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset, RandomSampler, SequentialSampler

from .plan import KINDS, RowSpec
from .prepare import PREP_KEY

__all__ = ["Loader", "Unavailable", "open_loader"]

JSON = 3  # the member kind of a JSON value (docs/formats.md), readable without pickleshard


class Unavailable(Exception):
    """This loader cannot run on this dataset or machine; the message says why."""


@dataclass
class Loader:
    """A row's dataset and sampler for the one DataLoader loop; ``collate`` replaces its
    default collate where given; ``batches`` (an iterable of batches, built for the row's
    batch size, stacking and workers) replaces the DataLoader itself."""

    dataset: Any
    sampler: Any | None
    samples: int
    note: str = ""
    collate: Any | None = None
    batches: Any | None = None


def _random(ds: Any, spec: RowSpec, cap: int | None = None) -> RandomSampler:
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    n = len(ds) if cap is None else min(cap, len(ds))
    return RandomSampler(ds, num_samples=n, generator=generator)


class PlainMemmap(Dataset[tuple[Any, Any]]):
    """pickleshard's memmap output read with numpy only, as docs/formats.md shows."""

    def __init__(self, root: Any) -> None:
        self.x = self._field(root, "x")
        self.y = np.load(root / "y.npy", mmap_mode="r")

    @staticmethod
    def _field(root: Any, name: str) -> Any:
        if (root / f"{name}.npy").exists():
            return np.load(root / f"{name}.npy", mmap_mode="r")
        kinds = np.load(root / f"{name}.kinds.npy", mmap_mode="r")
        if (root / f"{name}.values.npy").exists() and set(np.unique(kinds).tolist()) <= {JSON}:
            values = np.load(root / f"{name}.values.npy", mmap_mode="r")
            offsets = np.load(root / f"{name}.offsets.npy", mmap_mode="r")
            return (values, offsets)
        raise Unavailable(f"field {name!r} is stored in pickleshard's own codec, not JSON")

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        if isinstance(self.x, tuple):
            values, offsets = self.x
            x = json.loads(bytes(values[offsets[i] : offsets[i + 1]]))
        else:
            x = np.array(self.x[i])
        return x, int(self.y[i])


class PlainLmdb(Dataset[tuple[Any, Any]]):
    """pickleshard's LMDB output read with the plain ``lmdb`` module: one key per field value,
    ``f"{i:010d}.{field}.{ext}"``, decoded by its extension (docs/formats.md)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.env: Any = None
        with open(root / "pickleshard.json") as fh:
            self.n = int(json.load(fh)["num_samples"])

    def __len__(self) -> int:
        return self.n

    def _decode(self, ext: str, payload: bytes) -> Any:
        if ext in ("npy", "scalar.npy"):
            return np.load(io.BytesIO(payload))
        if ext == "cls":
            return int(payload)
        if ext == "txt":
            return payload.decode()
        if ext == "json":
            return json.loads(payload)
        raise Unavailable(f"a value stored as .{ext}")

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        import lmdb

        if self.env is None:  # opened per process: an LMDB environment must not cross a fork
            self.env = lmdb.open(str(self.root), readonly=True, lock=False, readahead=False)
        prefix = f"{i:010d}.".encode()
        out = []
        with self.env.begin() as txn:
            cursor = txn.cursor()
            cursor.set_range(prefix)
            for key, value in cursor:
                if not key.startswith(prefix):
                    break
                out.append(self._decode(key.decode().split(".", 2)[2], value))
        return out[0], out[1]


class PlainWebDataset(IterableDataset[tuple[Any, Any]]):
    """pickleshard's WebDataset shards read with the plain ``webdataset`` library."""

    def __init__(self, root: Any) -> None:
        with open(root / "pickleshard.json") as fh:
            self.urls = str(root / json.load(fh)["urls"])

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        import webdataset as wds  # type: ignore[import-untyped]

        ds = wds.WebDataset(self.urls, shardshuffle=100, nodesplitter=wds.split_by_node)
        for sample in ds.shuffle(1000).decode():
            x = sample.get("x.npy", sample.get("x.json"))
            yield x, int(sample["y.cls"])


class Tuples(Dataset[tuple[Any, Any]]):
    """A map-style dataset of ``{"x", "y"}`` dicts seen as ``(x, y)`` tuples."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        row = self.inner[i]
        return row["x"], row["y"]


def _pickleshard(spec: RowSpec) -> Loader:
    from pickleshard import (
        BlockShuffleSampler,
        PickleDataset,
        ShuffleSampler,
        collate,
        open_dataset,
    )
    from pickleshard import Loader as PickleshardLoader

    data, prep = spec.data, spec.data.prepared(PREP_KEY[spec.loader] or "")
    if spec.loader == "whole":
        ds = PickleDataset(
            data.directory, index=prep / "index", mode="whole", cache_bytes=spec.cache_bytes
        )
        blocks = BlockShuffleSampler(
            ds, batch_size=spec.batch_size, num_workers=spec.workers, cache_bytes=spec.cache_bytes
        )
        return Loader(ds, blocks, len(ds))
    if spec.loader in ("span", "span-collate", "loader"):
        ds = PickleDataset(data.directory, index=prep / "index", mode="span")
        sampler = ShuffleSampler(ds, seed=spec.seed)
        if spec.loader == "span":
            return Loader(ds, sampler, len(ds))
        stack = KINDS[data.kind][0] == "arrays"
        if spec.loader == "span-collate":
            if not stack:
                raise Unavailable("object samples are kept as lists by every row: no collate")
            return Loader(ds, sampler, len(ds), collate=collate)
        # the Loader's parallelism is threads (its reads release the GIL): the row's W worker
        # processes are W reading threads here, the comparison the issue asks for
        batches = PickleshardLoader(
            ds,
            spec.batch_size,
            sampler=sampler,
            threads=spec.workers,
            collate_fn=None if stack else list,
        )
        return Loader(ds, sampler, len(ds), batches=batches)
    conv = open_dataset(prep / "data", seed=spec.seed)
    if isinstance(conv, IterableDataset):
        return Loader(conv, None, len(conv))
    return Loader(conv, _random(conv, spec), len(conv))


def open_loader(spec: RowSpec) -> Loader:
    """The row's loader, opened in this process (peers through :mod:`.peers`)."""
    from bench.baselines import FolkJsonDataset, NaiveListDataset

    data, key = spec.data, PREP_KEY[spec.loader]
    prep = data.prepared(key) if key else None
    if spec.loader == "naive":
        naive = NaiveListDataset(sorted(data.directory.glob("*.pkl")))
        return Loader(naive, _random(naive, spec), len(naive))
    if spec.loader in ("folk-seq", "folk-shuffled"):
        assert prep is not None
        folk = FolkJsonDataset(prep / "folk.json")
        if spec.loader == "folk-seq":
            return Loader(folk, SequentialSampler(folk), len(folk), "sequential order")
        n = min(spec.folk_cap, len(folk))
        return Loader(folk, _random(folk, spec, n), n, f"first {n:,} shuffled indices")
    if spec.loader in (
        "whole",
        "span",
        "span-collate",
        "loader",
        "memmap",
        "lmdb",
        "webdataset",
        "lance",
        "arrayrecord",
    ):
        return _pickleshard(spec)
    assert prep is not None
    if spec.loader == "memmap-plain":
        plain = PlainMemmap(prep / "data")
        return Loader(plain, _random(plain, spec), len(plain))
    if spec.loader == "lmdb-plain":
        db = PlainLmdb(prep / "data")
        db[0]  # decodable without pickleshard, or Unavailable now
        db.env = None
        return Loader(db, _random(db, spec), len(db))
    if spec.loader == "webdataset-plain":
        return Loader(PlainWebDataset(prep / "data"), None, data.num_samples)
    from .peers import open_peer

    return open_peer(spec, prep)
