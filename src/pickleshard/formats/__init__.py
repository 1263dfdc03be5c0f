"""Output formats of ``pickleshard convert``: memmap, LMDB, WebDataset, Parquet, Arrow; and reading.

:func:`open_dataset` opens any converted directory as a dataset with PickleDataset's interface.
The interface every format implements is in :mod:`pickleshard.formats.base`; each format's
on-disk layout is in its module's docstring (:mod:`~pickleshard.formats.memmap`,
:mod:`~pickleshard.formats.lmdb`, :mod:`~pickleshard.formats.webdataset`). Formats are found by
name in a registry (:mod:`~pickleshard.formats.registry`): a third-party format is a
:class:`Format` subclass and one :func:`register_format` call. Backends are imported only when
used: LMDB needs ``pip install 'pickleshard[lmdb]'``, Parquet and Arrow (:mod:`~pickleshard.formats.arrow.format`)
``pip install 'pickleshard[parquet]'``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConvertedDatasetError
from ..safety import UnpicklePolicy
from .base import (
    DESCRIPTOR_NAME,
    ConvertedDataset,
    Format,
    PartResult,
    PartSpec,
    PartWriter,
    ReadOptions,
    WriteOptions,
    read_descriptor,
)
from .registry import BUILTIN_FORMATS, available_formats, format_class, get_format, register_format

__all__ = [
    "FORMAT_NAMES",
    "ConvertedDataset",
    "Format",
    "PartResult",
    "PartSpec",
    "PartWriter",
    "ReadOptions",
    "WriteOptions",
    "available_formats",
    "format_class",
    "get_format",
    "open_dataset",
    "register_format",
]

#: the formats that ship with pickleshard (``pickleshard convert --to`` offers these)
FORMAT_NAMES = tuple(BUILTIN_FORMATS)


def open_dataset(
    out: str | os.PathLike[str],
    *,
    shuffle: bool = True,
    seed: int = 0,
    buffer_size: int = 1000,
    rank: int | None = None,
    world_size: int | None = None,
    drop_last: bool = False,
    trusted: bool = False,
    allow_globals: Iterable[str] = (),
) -> ConvertedDataset:
    """Open the output of :func:`pickleshard.pipelines.convert.run` for reading.

    memmap, LMDB, Parquet and Arrow give a map-style dataset (``len``, ``ds[i]`` -> tuple, ``__getitems__``);
    shuffle those with the DataLoader's sampler. WebDataset gives an ``IterableDataset`` that
    also supports ``ds[i]``; the keyword arguments apply to its iteration only: shard shuffle
    and a ``buffer_size`` shuffle from ``(seed, epoch)``, split across DDP ranks (``rank`` /
    ``world_size``, default from ``torch.distributed``) and DataLoader workers.
    Values stored as pickles (anything but arrays, numbers, text and JSON) load under the
    same restricted unpickling as :class:`pickleshard.PickleDataset`: the default allowlist,
    plus ``allow_globals`` (``["module.name", ...]``), or everything with ``trusted=True``.
    The format is the one registered under the descriptor's ``"to"`` name (a third-party format
    must be registered in this process too). Raises
    :class:`~pickleshard.errors.ConvertedDatasetError` if ``out`` is not a conversion or names
    a format not registered here.
    """
    root = Path(out)
    descriptor = read_descriptor(root)
    policy = UnpicklePolicy.from_args(trusted=trusted, allow_globals=allow_globals)
    options = ReadOptions(policy, shuffle, seed, buffer_size, rank, world_size, drop_last)
    name = descriptor["to"]
    try:
        fmt = get_format(name) if isinstance(name, str) else None
    except ValueError as exc:
        raise ConvertedDatasetError(root / DESCRIPTOR_NAME, str(exc)) from None
    if fmt is None:
        raise ConvertedDatasetError(
            root / DESCRIPTOR_NAME, f"format name is not a string: {name!r}"
        )
    return fmt.open(root, descriptor, options)
