"""The loaders a user would pick instead of pickleshard, each reading its own tool's output.

Each is imported only here, lazily; a peer that is not installed raises
:class:`~bench.suite.loaders.Unavailable` with the install command.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset

from .loaders import Loader, Tuples, Unavailable, _random
from .plan import RowSpec

__all__ = ["open_peer"]

INSTALL = {
    "litdata": "pip install litdata",
    "mosaic": "pip install mosaicml-streaming",
    "hf": "pip install datasets",
}


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
        if spec.loader == "hf":
            import datasets

            hf = datasets.load_from_disk(str(prep / "data")).with_format("numpy")
            ds = Tuples(hf)
            return Loader(ds, _random(ds, spec), len(ds))
    except ImportError as exc:
        raise Unavailable(f"cannot import {exc.name} ({exc}): {INSTALL[spec.loader]}") from None
    raise ValueError(f"no loader called {spec.loader!r}")
