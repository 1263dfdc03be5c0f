"""``MixSampler``: a :class:`~pickleshard.samplers.ShuffleSampler` whose indices name their epoch.

The order, the split across ranks, ``state_dict``/``load_state_dict`` and resuming on another
world size or worker count are ShuffleSampler's, unchanged: the sampler shuffles the positions
``[0, epoch_size)`` of the mix's epoch exactly once per epoch. What it adds is the epoch: each
index it yields is ``(epoch + 1) * epoch_size + position``, ``epoch`` being that of the pass
that yields it (a loaded state's, else the one :meth:`set_epoch` set), and
:class:`~pickleshard.mixing.dataset.MixedDataset` reads the epoch from the index.

Why not ``mix.set_epoch`` alone: DataLoader workers hold copies of the mix made when the
loader's iterator starts (forked, or pickled), before the sampler's pass has chosen its epoch,
and persistent workers keep theirs across epochs; a resumed pass runs the loaded state's epoch,
not the one set. An index that carries its epoch is right in every copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..samplers import ShuffleSampler
from .dataset import MixedDataset

__all__ = ["MixSampler"]


class MixSampler(ShuffleSampler):
    """Every position of ``mix``'s epoch once per epoch, shuffled and split across ranks.

    Takes ShuffleSampler's keyword arguments (``seed``, ``rank``, ``world_size``,
    ``drop_last``, ``shuffle``, ``chunk_size``) and its state; :meth:`set_epoch` also sets
    the mix's epoch (for ``mix[i]`` with ``i < epoch_size`` in this process), and raises as
    ``mix.set_epoch`` does for an epoch the ``"stop"`` policy cannot fill.
    """

    def __init__(self, mix: MixedDataset, **kwargs: Any) -> None:
        super().__init__(mix, **kwargs)
        self.mix = mix

    def set_epoch(self, epoch: int) -> None:
        self.mix.set_epoch(epoch)
        super().set_epoch(epoch)

    def _stream(self, state: dict[str, Any]) -> Iterator[int]:
        stamp = (state["epoch"] + 1) * self.num_samples_total
        for position in super()._stream(state):
            yield stamp + position
