"""Output formats of ``pickleshard convert``: memmap, LMDB, WebDataset; and reading them back.

:func:`open_dataset` opens any converted directory as a dataset with PickleDataset's interface.
The interface every format implements is in :mod:`pickleshard.formats.base`; each format's
on-disk layout is in its module's docstring (:mod:`~pickleshard.formats.memmap`,
:mod:`~pickleshard.formats.lmdb`, :mod:`~pickleshard.formats.webdataset`). Backends are imported
only when used: LMDB needs ``pip install 'pickleshard[lmdb]'``.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..errors import ConvertedDatasetError
from .base import (
    DESCRIPTOR_NAME,
    ConvertedDataset,
    Format,
    IterableOptions,
    PartResult,
    PartSpec,
    PartWriter,
    WriteOptions,
    read_descriptor,
)

__all__ = [
    "FORMAT_NAMES",
    "ConvertedDataset",
    "Format",
    "IterableOptions",
    "PartResult",
    "PartSpec",
    "PartWriter",
    "WriteOptions",
    "get_format",
    "open_dataset",
]

_BACKENDS = {
    "memmap": ("memmap", "MemmapFormat"),
    "lmdb": ("lmdb", "LmdbFormat"),
    "webdataset": ("webdataset", "WebDatasetFormat"),
}
FORMAT_NAMES = tuple(_BACKENDS)


def get_format(name: str | Format) -> Format:
    """The format called ``name`` (``"memmap"``, ``"lmdb"``, ``"webdataset"``), or ``name`` itself.

    Raises ``ValueError`` for an unknown name and
    :class:`~pickleshard.errors.MissingDependencyError` when its backend is not installed.
    """
    if isinstance(name, Format):
        return name
    if name not in _BACKENDS:
        raise ValueError(f"unknown format {name!r}; expected one of {', '.join(FORMAT_NAMES)}")
    module, cls = _BACKENDS[name]
    backend = importlib.import_module(f".{module}", __name__)
    fmt: Format = getattr(backend, cls)()
    return fmt


def open_dataset(
    out: str | os.PathLike[str],
    *,
    shuffle: bool = True,
    seed: int = 0,
    buffer_size: int = 1000,
    rank: int | None = None,
    world_size: int | None = None,
    drop_last: bool = False,
) -> ConvertedDataset:
    """Open the output of :func:`pickleshard.conversion` for reading.

    memmap and LMDB give a map-style dataset (``len``, ``ds[i]`` -> tuple, ``__getitems__``);
    shuffle those with the DataLoader's sampler. WebDataset gives an ``IterableDataset`` that
    also supports ``ds[i]``; the keyword arguments apply to its iteration only: shard shuffle
    and a ``buffer_size`` shuffle from ``(seed, epoch)``, split across DDP ranks (``rank`` /
    ``world_size``, default from ``torch.distributed``) and DataLoader workers.
    Raises :class:`~pickleshard.errors.ConvertedDatasetError` if ``out`` is not a conversion.
    """
    root = Path(out)
    descriptor = read_descriptor(root)
    options = IterableOptions(shuffle, seed, buffer_size, rank, world_size, drop_last)
    if descriptor["to"] not in _BACKENDS:
        raise ConvertedDatasetError(
            root / DESCRIPTOR_NAME,
            f"unknown format {descriptor['to']!r}; this pickleshard reads {', '.join(FORMAT_NAMES)}",
        )
    return get_format(descriptor["to"]).open(root, descriptor, options)
