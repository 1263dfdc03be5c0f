"""Mixing: several map-style datasets as one, in weighted proportions per epoch.

- :class:`~pickleshard.mixing.dataset.MixedDataset` (``dataset.py``): the mix, over any
  map-style datasets (``PickleDataset``, ``open_dataset`` results) duck-typed, so this package
  sits above ``samplers`` (it uses the Feistel permutation and ``ShuffleSampler``) and imports
  neither ``dataset`` nor ``formats``;
- :class:`~pickleshard.mixing.plan.MixPlan` (``plan.py``): the arithmetic of an epoch (counts,
  shuffled positions, draws per source, the exhaustion policy);
- :class:`~pickleshard.mixing.sampler.MixSampler` (``sampler.py``): ShuffleSampler whose indices
  carry their epoch, so workers and resumed passes read the right epoch's mix.

See ``docs/mixing.md``.
"""

from .dataset import MixedDataset
from .errors import MixedFieldsError, SourceExhaustedError
from .plan import POLICIES, MixPlan, Policy, apportion
from .sampler import MixSampler

__all__ = [
    "POLICIES",
    "MixPlan",
    "MixSampler",
    "MixedDataset",
    "MixedFieldsError",
    "Policy",
    "SourceExhaustedError",
    "apportion",
]
