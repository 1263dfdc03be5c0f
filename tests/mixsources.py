"""Sources for the mixing tests: id-labelled samples in pickle folders, and their oracle.

Sample ``k`` of source ``s`` is ``(np.full(2, id, float32), id)`` with ``id = 1000 * s + k``, so
a mixed sample names where it came from; :func:`oracle` reads a folder back with ``pickle.load``
alone.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np


def write_source(folder: Path, source: int, size: int, files: int = 3) -> list[int]:
    """Write ``size`` id-labelled samples of ``source`` in ``files`` files; return their ids."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = [1000 * source + k for k in range(size)]
    for f, part in enumerate(np.array_split(np.asarray(ids), files)):
        xs = [np.full(2, i, dtype=np.float32) for i in part.tolist()]
        with open(folder / f"part-{f:05d}.pkl", "wb") as fh:
            pickle.dump((xs, part.tolist()), fh, protocol=5)
    return ids


def oracle(folder: Path) -> list[tuple[Any, ...]]:
    """Every sample of a source folder by ``pickle.load`` of its files, in name order."""
    out: list[tuple[Any, ...]] = []
    for path in sorted(folder.glob("*.pkl")):
        with open(path, "rb") as fh:
            xs, ys = pickle.load(fh)
        out += list(zip(xs, ys, strict=True))
    return out
