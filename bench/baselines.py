"""The datasets pickleshard is measured against, written the way people write them.

- :class:`NullDataset`: no data at all (a zero array per sample): the cost and memory of the
  DataLoader loop itself, i.e. the fixed overhead under every other row.
- :class:`NaiveListDataset`: every file unpickled up front into one Python list.
- :class:`FolkJsonDataset`: the per-sample JSON index plus "keep the last loaded file" Dataset
  described in DESIGN.md ("The naive baseline and why it fails").

Each counts the files it unpickles in ``file_loads`` (per process: a forked DataLoader worker
starts with its parent's count, see :mod:`bench.counting`).
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

__all__ = ["FolkJsonDataset", "NaiveListDataset", "NullDataset", "RawMemmap", "write_folk_index"]

Sample = tuple[Any, Any]


class NullDataset(Dataset[Sample]):
    """``n`` samples of ``(zeros(shape, float32), 0)``; reads no file."""

    def __init__(self, n: int, shape: tuple[int, ...]) -> None:
        self.n = n
        self.shape = shape
        self.file_loads = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Sample:
        return np.zeros(self.shape, dtype=np.float32), 0


class NaiveListDataset(Dataset[Sample]):
    """All samples of all files in one list of ``(x, y)``, loaded by the constructor."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self.samples: list[Sample] = []
        self.file_loads = 0
        for path in paths:
            with open(path, "rb") as fh:
                xs, ys = pickle.load(fh)
            self.file_loads += 1
            self.samples.extend(zip(xs, ys, strict=True))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]


def write_folk_index(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> int:
    """Write the folk JSON index of ``paths`` to ``out``; return the number of files unpickled.

    As it is usually done: unpickle each file to count its samples, then dump a list of
    ``{"file_path": ..., "inner_idx": ...}`` dicts, one per sample.
    """
    entries: list[dict[str, Any]] = []
    for path in paths:
        with open(path, "rb") as fh:
            xs, _ = pickle.load(fh)
        entries.extend({"file_path": os.fspath(path), "inner_idx": i} for i in range(len(xs)))
    Path(out).write_text(json.dumps(entries))
    return len(paths)


class FolkJsonDataset(Dataset[Sample]):
    """The folk Dataset: a JSON list of dicts, and the last unpickled file kept in memory."""

    def __init__(self, index_path: str | os.PathLike[str]) -> None:
        with open(index_path) as fh:
            self.index: list[dict[str, Any]] = json.load(fh)
        self.current_path: str | None = None
        self.data: Any = None
        self.file_loads = 0

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Sample:
        entry = self.index[i]
        path = entry["file_path"]
        if path != self.current_path:
            with open(path, "rb") as fh:
                self.data = pickle.load(fh)
            self.current_path = path
            self.file_loads += 1
        xs, ys = self.data
        return xs[entry["inner_idx"]], ys[entry["inner_idx"]]


class RawMemmap(Dataset[tuple[Any, int]]):
    """Converted data read with plain numpy: ``np.load(mmap_mode="r")`` of ``x.npy`` and
    ``y.npy`` in ``root``; one sample per ``__getitem__``."""

    def __init__(self, root: Path) -> None:
        self.x = np.load(root / "x.npy", mmap_mode="r")
        self.y = np.load(root / "y.npy", mmap_mode="r")

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return np.array(self.x[i]), int(self.y[i])
