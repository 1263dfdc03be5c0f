"""The dataset a pipeline reads: what ``convert`` and ``verify`` open their source as."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..dataset import PickleDataset
from ..io.listing import Source
from ..producers.plain import ConvertTransform
from ..scan.layouts import LayoutChoice

__all__ = ["source_dataset"]


def source_dataset(
    source: Source | PickleDataset,
    *,
    trusted: bool = False,
    allow_globals: Iterable[str] = (),
    encoding: str = "ASCII",
    jobs: int | None = None,
    progress: bool = False,
    allow: str | Iterable[str] = (),
    transform: Callable[[Any], Any] | None = None,
    layout: LayoutChoice = "auto",
    storage_options: Mapping[str, Any] | None = None,
) -> PickleDataset:
    """``source`` as a :class:`~pickleshard.PickleDataset` that keeps one decoded file at a time.

    A PickleDataset is copied (without its cache; with its own storage options); anything else
    is opened with ``trusted``, ``allow_globals``, ``encoding``, ``layout`` and
    ``storage_options`` (a URL's), its index built (``jobs`` processes) if missing or stale.
    """
    if isinstance(source, PickleDataset):
        ds = copy.copy(source)  # a copy without the cache (PickleDataset.__getstate__)
    else:
        ds = PickleDataset(
            source,
            rebuild="auto",
            trusted=trusted,
            allow_globals=allow_globals,
            allow=allow,
            encoding=encoding,
            jobs=jobs,
            progress=progress,
            layout=layout,
            storage_options=storage_options,
        )
    # then convert's transform=, then PIL images and sparse matrices as arrays (producers.plain)
    ds.transform = ConvertTransform(ds.transform, transform)
    ds.sample_form = ds.sample_form.as_tuples()  # parts are written and hashed field by field
    ds.cache_bytes = 0  # conversion reads files in order: one decoded file per process suffices
    return ds
