"""``MixSampler``: a :class:`~pickleshard.samplers.ShuffleSampler` whose indices are resolved.

The split across ranks, ``state_dict``/``load_state_dict`` and resuming on another world size or
worker count are ShuffleSampler's, unchanged: the sampler takes the positions ``[0, epoch_size)``
of the mix's epoch exactly once per epoch (in the mix's own shuffled order unless
``shuffle=True``). What it adds: each chunk of
positions it takes is resolved (:meth:`MixedDataset.resolve
<pickleshard.mixing.dataset.MixedDataset.resolve>`) for the epoch of the pass that yields it (a
loaded state's, else the one :meth:`set_epoch` set) into indices that name their source and
sample, and those are what it yields.

Why: DataLoader workers hold copies of the mix made when the loader's iterator starts (forked,
or pickled), before the sampler's pass has chosen its epoch, and persistent workers keep theirs
across epochs; a resumed pass runs the loaded state's epoch, not the one set. A resolved index
is right in every copy. And the mix's arithmetic (two Feistel evaluations) runs here on chunks
of ``chunk_size`` positions, not on every batch in a worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..samplers import FeistelPermutation, ShuffleSampler
from .dataset import MixedDataset

__all__ = ["MixSampler"]


class MixSampler(ShuffleSampler):
    """Every position of ``mix``'s epoch once per epoch, in the mix's order, split across ranks.

    The mix is already shuffled (its positions are a Feistel permutation keyed by the mix's
    ``seed`` and the epoch), so by default the sampler adds no shuffle of its own
    (``shuffle=False``): rank ``r`` of ``W`` takes positions ``r, r + W, ...`` of the mix's
    order. ``shuffle=True`` permutes the positions again with the sampler's ``seed``, at the cost
    of a second Feistel evaluation per sample. The other keyword arguments (``seed``, ``rank``,
    ``world_size``, ``drop_last``, ``chunk_size``) and the state are ShuffleSampler's.
    :meth:`set_epoch` also sets the mix's epoch (for ``mix[i]`` with ``i < epoch_size`` in this
    process), and raises as ``mix.set_epoch`` does for an epoch the ``"stop"`` policy cannot
    fill.
    """

    def __init__(self, mix: MixedDataset, *, shuffle: bool = False, **kwargs: Any) -> None:
        super().__init__(mix, shuffle=shuffle, **kwargs)
        self.mix = mix

    def set_epoch(self, epoch: int) -> None:
        self.mix.set_epoch(epoch)
        super().set_epoch(epoch)

    def _stream(self, state: dict[str, Any]) -> Iterator[int]:
        # ShuffleSampler._stream's positions (the same split and state arithmetic, which the
        # inherited _state_after counts), each chunk resolved before it is handed out: done on
        # the chunk's array, not through the parent's generator, as this runs once per sample.
        n, start, epoch = self.num_samples_total, state["samples_seen"], state["epoch"]
        count = self._rank_count(start)
        perm = FeistelPermutation(n, state["seed"], epoch) if self.shuffle and n else None
        for first in range(0, count, self.chunk_size):
            j = np.arange(first, min(count, first + self.chunk_size), dtype=np.int64)
            positions = (start + self.rank + j * self.world_size) % n
            chunk = positions if perm is None else perm(positions)
            yield from self.mix.resolve(epoch, chunk).tolist()
