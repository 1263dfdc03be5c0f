"""Samplers: the order in which samples are read, split across DDP ranks and DataLoader workers.

Every sampler is a :class:`~pickleshard.samplers.base.ResumableSampler` (resumable state,
``set_epoch``, the pass it returns), and writes only the hooks that make its order:

- :class:`~pickleshard.samplers.shuffle.ShuffleSampler` (``shuffle.py``): an exact global shuffle,
  resumable on another world size or worker count;
- :class:`~pickleshard.samplers.block.BlockShuffleSampler` (``block.py``): files shuffled, samples
  shuffled within windows of files that fit the whole-file cache's budget.
"""

from .base import ResumableSampler, SamplerPass, distributed_rank_and_world
from .block import BlockShuffleSampler
from .shuffle import FeistelPermutation, ShuffleSampler, sampler_state_from_loader

__all__ = [
    "BlockShuffleSampler",
    "FeistelPermutation",
    "ResumableSampler",
    "SamplerPass",
    "ShuffleSampler",
    "distributed_rank_and_world",
    "sampler_state_from_loader",
]
