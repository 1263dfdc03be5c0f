"""``pickleshard.collate``: the ``collate_fn`` that turns a batch read by field into tensors.

``DataLoader(ds, batch_size=64, collate_fn=pickleshard.collate)``: ``ds.__getitems__`` reads
the batch into its columns (:class:`~pickleshard.read.batch.SampleBatch`), and :func:`collate`
hands each column over as a tensor without touching a sample: an array column *is* the batch's
``(B, *shape)`` tensor (``torch.from_numpy``, no copy), an int column its int64 tensor, a column
of object values decoded into their leaves' columns (:mod:`pickleshard.read.objectcolumns`) the
nested dicts and lists of tensors and strings ``default_collate`` would build; a column
of other values is collated as ``default_collate`` does. Anything else (a list of samples, a
batch that went through a ``transform``) goes to ``default_collate``. Either way the result
equals ``default_collate([ds[i] for i in indices])``: types, dtypes, shapes and values (the
tests' oracle).

In a ``DataLoader`` worker, :func:`batch_allocator` gives the batch's array columns shared
memory (what ``default_collate`` does for its output there), so the tensor crosses to the main
process without another copy; ``pin_memory=True`` gives page-locked memory for a fast copy to
the GPU.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..errors import PickleshardError
from .batch import ARRAYS, DECODED, INTS, Allocate, BatchColumn, SampleBatch
from .objectcolumns import NotCollatable

__all__ = ["batch_allocator", "collate"]


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        raise PickleshardError(
            "pickleshard.collate makes torch tensors and needs torch: pip install torch "
            "(or 'pickleshard[torch]'); without torch, use the batch's columns "
            "(SampleBatch.columns) as numpy arrays"
        ) from None
    return torch


def collate(batch: Any) -> Any:
    """The batch ``batch`` (a :class:`SampleBatch` from ``__getitems__``, or any list of
    samples) collated to tensors, equal to ``torch.utils.data.default_collate`` of its samples."""
    torch = _torch()
    if not isinstance(batch, SampleBatch):
        return torch.utils.data.default_collate(batch)
    fields = [_column(torch, c) for c in batch.columns]
    return batch.collated(fields)


def _column(torch: Any, column: BatchColumn) -> Any:
    if column.kind == ARRAYS:
        owner = column.owner
        return owner if isinstance(owner, torch.Tensor) else torch.from_numpy(column.data)
    if column.kind == INTS:
        return torch.from_numpy(column.data)
    if column.kind == DECODED:  # object values decoded into their leaves' columns
        try:
            return column.data.collated(torch)
        except NotCollatable:  # default_collate raises for them: let it say why
            return torch.utils.data.default_collate(tuple(column.data.values()))
    # a tuple, as default_collate's transpose of tuple samples gives it (strings come back so)
    return torch.utils.data.default_collate(tuple(column.data))


def batch_allocator(pin_memory: bool = False) -> Allocate | None:
    """How a batch's array columns are allocated here: in shared memory inside a torch
    ``DataLoader`` worker, page-locked with ``pin_memory``, else None (``numpy.empty``)."""
    torch = sys.modules.get("torch")
    if torch is None and not pin_memory:
        return None  # torch never imported: no DataLoader worker can be running this
    if pin_memory:
        return _pinned
    info = torch.utils.data.get_worker_info() if torch is not None else None
    return _shared if info is not None else None


def _torch_dtype(torch: Any, dtype: np.dtype[Any]) -> Any:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _shared(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    torch = _torch()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=_torch_dtype(torch, dtype)).set_(storage, 0, shape)


def _pinned(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    torch = _torch()
    return torch.empty(shape, dtype=_torch_dtype(torch, dtype), pin_memory=True)
