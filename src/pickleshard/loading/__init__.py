"""Loading: batches served to a training loop with the next batches' reads in flight.

- :class:`~pickleshard.loading.loader.Loader` (``loader.py``): ``pickleshard.Loader``, read-ahead
  in the sampler's order in threads (or worker processes), bounded by batches and bytes in
  flight, resumable;
- :mod:`~pickleshard.loading.passes` (``passes.py``): one pass of it, read ahead by threads, in
  the loop's thread, or by worker processes;
- :mod:`~pickleshard.loading.ahead` (``ahead.py``): the next batches' samples fetched ahead over a
  window, a chunk at a time (remote files);
- :mod:`~pickleshard.loading.making` (``making.py``): one batch made from its indices (read,
  transform, collate, pin), each stage timed;
- :mod:`~pickleshard.loading.stats` (``stats.py``): where an epoch's time goes, and
  :func:`~pickleshard.loading.stats.advice`, the one setting most likely to help.
"""

from .loader import DEFAULT_BYTES_IN_FLIGHT, DEFAULT_PREFETCH, Loader
from .making import BatchMaker
from .stats import BatchTimes, EpochStats, advice, stats_table

__all__ = [
    "DEFAULT_BYTES_IN_FLIGHT",
    "DEFAULT_PREFETCH",
    "BatchMaker",
    "BatchTimes",
    "EpochStats",
    "Loader",
    "advice",
    "stats_table",
]
