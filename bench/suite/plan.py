"""What the suite runs: datasets (kind x size), loaders, and rows (loader x dataset x workers).

Everything here is plain data, so it travels to a child process as JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "KINDS",
    "LOADERS",
    "PEERS",
    "DataKind",
    "DatasetSpec",
    "RowSpec",
    "datasets_for",
    "loader_label",
]

DataKind = Literal["arrays12k", "arrays400k", "objects"]

#: kind -> (synthetic kind, sample shape, human description)
KINDS: dict[str, tuple[str, tuple[int, ...], str]] = {
    "arrays12k": ("arrays", (3, 32, 32), "float32 (3, 32, 32) arrays (12 KB) + int labels"),
    "arrays400k": ("arrays", (100, 1000), "float32 (100, 1000) arrays (400 KB) + int labels"),
    "objects": ("objects", (), "dicts of a token list, a string and a float + int labels"),
}

#: loader -> label. Order is the report's order.
LOADERS: dict[str, str] = {
    "naive": "naive: pickle.load everything into a list",
    "folk-seq": "folk JSON index + one-file cache, sequential",
    "folk-shuffled": "folk JSON index + one-file cache, shuffled (capped)",
    "whole": "PickleDataset whole-file + BlockShuffleSampler",
    "span": "PickleDataset span reads + ShuffleSampler",
    "span-collate": "PickleDataset span reads + ShuffleSampler + collate_fn=pickleshard.collate",
    "loader": "pickleshard.Loader (reads ahead in the sampler's order; W reading threads, no processes)",
    "memmap": "pickleshard memmap via open_dataset",
    "memmap-plain": "memmap read with plain numpy (np.load mmap_mode='r')",
    "lmdb": "pickleshard LMDB via open_dataset",
    "lmdb-plain": "LMDB read with plain lmdb (cursor per sample + np.load)",
    "webdataset": "pickleshard WebDataset via open_dataset",
    "webdataset-plain": "WebDataset read with plain webdataset (shuffle(1000).decode())",
    "lance": "pickleshard Lance via open_dataset",
    "lance-plain": "Lance (pickleshard convert) read with lance.torch LanceDataset",
    "arrayrecord": "pickleshard ArrayRecord via open_dataset",
    "grain": "grain MapDataset over ArrayRecord (pickleshard convert): global shuffle",
    "litdata": "LitData optimize + StreamingDataset",
    "mosaic": "MosaicML Streaming MDSWriter + StreamingDataset",
    "hf": "HF datasets from_generator (Arrow) + with_format('numpy')",
}

#: loaders that need a library pickleshard does not depend on (run with --peer-python if given)
PEERS = ("litdata", "mosaic", "hf", "lance-plain", "grain")


def loader_label(loader: str) -> str:
    return LOADERS.get(loader, loader)


@dataclass(frozen=True)
class DatasetSpec:
    """``files`` pickles of ``per_file`` samples of ``kind`` under ``root/name``."""

    root: str
    kind: str
    size: str  # "cached" | "cold"
    files: int
    per_file: int

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.files}x{self.per_file}"

    @property
    def directory(self) -> Path:
        return Path(self.root) / self.name / "pickles"

    def prepared(self, loader: str) -> Path:
        """Where ``loader``'s index or converted copy of this dataset lives."""
        return Path(self.root) / self.name / f"prep-{loader}"

    @property
    def num_samples(self) -> int:
        return self.files * self.per_file

    @property
    def cold(self) -> bool:
        return self.size == "cold"

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DatasetSpec:
        return cls(**obj)


@dataclass(frozen=True)
class RowSpec:
    """One epoch of one loader over one dataset, in a fresh process."""

    loader: str
    data: DatasetSpec
    workers: int
    batch_size: int
    cache_bytes: int
    folk_cap: int
    seed: int = 0
    memory_interval: float = 0.1
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RowSpec:
        return cls(**{**obj, "data": DatasetSpec.from_json(obj["data"])})


#: (files, per_file) per kind for each suite. "cold" datasets pass the full suite's 256 MiB cache
#: budget, which counts decoded bytes: arrays 3x; objects 2.1x decoded (about 1.2 KB a sample as
#: the index sizes it), though only 59 MB of pickles (see docs/benchmarks.md)
_SIZES: dict[str, dict[str, dict[str, tuple[int, int]]]] = {
    "full": {  # sized so the whole suite (168 rows) runs within one 90-minute window on 2 cores
        "arrays12k": {"cached": (8, 2_500), "cold": (16, 4_000)},  # 246 MB, 787 MB
        "arrays400k": {"cached": (8, 75), "cold": (16, 120)},  # 240 MB, 768 MB
        "objects": {"cached": (8, 12_500), "cold": (16, 30_000)},  # 119 MB, 571 MB decoded
    },
    "quick": {
        "arrays12k": {"cold": (4, 500)},
        "arrays400k": {"cold": (4, 20)},
        "objects": {"cold": (4, 1_000)},
    },
}


def datasets_for(suite: str, root: Path, kinds: tuple[str, ...]) -> list[DatasetSpec]:
    """The datasets of ``suite`` ("full" or "quick") for ``kinds``, under ``root``."""
    out = []
    for kind in kinds:
        for size, (files, per_file) in _SIZES[suite][kind].items():
            out.append(DatasetSpec(str(root), kind, size, files, per_file))
    return out
