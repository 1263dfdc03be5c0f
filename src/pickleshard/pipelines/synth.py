"""Synthetic datasets in the common "seed" layout: each file is ``pickle.dump((x_list, y_list))``.

Used by ``make demo``, the tests and the benchmarks, so that all three exercise the layout that
users actually have.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..io.atomic import atomic_file

__all__ = ["write_synthetic"]

Kind = Literal["arrays", "objects"]

_WORDS = ("cat", "dog", "tree", "river", "stone", "cloud", "lamp", "road", "bird", "leaf")


def _object_sample(rng: np.random.Generator) -> dict[str, Any]:
    n = int(rng.integers(4, 32))
    return {
        "tokens": rng.integers(0, 30_000, size=n).tolist(),
        "text": " ".join(_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), size=n // 2)),
        "score": float(rng.random()),
    }


def write_synthetic(
    out: str | os.PathLike[str],
    *,
    files: int = 8,
    per_file: int = 1000,
    shape: tuple[int, ...] = (3, 32, 32),
    kind: Kind = "arrays",
    protocol: int = pickle.HIGHEST_PROTOCOL,
    num_classes: int = 10,
    seed: int = 0,
    prefix: str = "part",
) -> list[Path]:
    """Write ``files`` pickle files of ``per_file`` samples each into ``out``; return their paths.

    Each file holds ``(x_list, y_list)``: for ``kind="arrays"`` every ``x`` is a float32 array of
    ``shape``; for ``kind="objects"`` a small dict of Python objects (a token list, a string, a
    float). Every ``y`` is a Python ``int`` label in ``[0, num_classes)``. Output is a pure
    function of the arguments. Files are written to a temporary name and renamed, so a file
    that exists is complete.
    """
    if files < 1 or per_file < 0:
        raise ValueError(f"files must be >= 1 and per_file >= 0, got {files} and {per_file}")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        rng = np.random.default_rng([seed, f])
        if kind == "arrays":
            block = rng.standard_normal((per_file, *shape), dtype=np.float32)
            xs: list[Any] = [np.ascontiguousarray(row) for row in block]
        elif kind == "objects":
            xs = [_object_sample(rng) for _ in range(per_file)]
        else:
            raise ValueError(f"kind must be 'arrays' or 'objects', got {kind!r}")
        ys = rng.integers(0, num_classes, size=per_file).tolist()
        path = out_dir / f"{prefix}-{f:05d}.pkl"
        with atomic_file(path) as fh:
            pickle.dump((xs, ys), fh, protocol=protocol)
        paths.append(path)
    return paths
