"""``MixPlan``: which sample of which source sits at each position of a mixed epoch, by arithmetic.

Nothing here is a list of the epoch's indices: every answer is computed from ``(seed, epoch,
position)`` in numpy, O(1) memory per sample.

1. **Counts.** Each epoch draws exactly ``counts[s]`` samples from source ``s``, the same every
   epoch: absolute counts as given, or ``epoch_size`` apportioned by the weights with the largest
   remainder method (:func:`apportion`, exact in rational arithmetic, ties to the lower source).
2. **Positions.** Lay the epoch out as the sources' draws end to end (``counts[0]`` positions
   for source 0, then source 1, ...), then shuffle the positions with a
   :class:`~pickleshard.samplers.FeistelPermutation` of ``[0, epoch_size)`` keyed by
   ``(seed, epoch)``: position ``q`` holds the ``k``-th draw of epoch ``epoch`` from source ``s``
   where ``perm(q)`` falls in ``s``'s block at offset ``k``.
3. **Draws.** Source ``s``'s draws are numbered across epochs, ``g = epoch * counts[s] + k``,
   so a source's order continues from one epoch to the next. Draw ``g`` falls in pass
   ``g // n`` over the source (``n`` samples) at offset ``g % n``; each pass is a Feistel
   permutation of ``[0, n)`` keyed by ``(seed, source, pass)``, so no sample repeats within a
   source before it is exhausted. (When an epoch draws whole passes of a source, ``counts[s]``
   a multiple of ``n``, every pass lies in one epoch and the position shuffle alone places its
   samples at random: the pass is taken in sample order, saving a permutation per sample.) What happens after the first pass is the policy:

   - ``"repeat"``: the next pass, a fresh permutation: every sample once per pass;
   - ``"resample"``: samples drawn uniformly with replacement (a keyed hash of ``g``);
   - ``"stop"``: none: an epoch that would need a second pass raises
     :class:`~pickleshard.mixing.errors.SourceExhaustedError`, naming the source and the
     last epoch it can fill.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from ..io.lru import BudgetCache
from ..samplers.shuffle import FeistelPermutation, splitmix64
from .errors import SourceExhaustedError

__all__ = ["POLICIES", "MixPlan", "Policy", "apportion"]

Policy = Literal["stop", "repeat", "resample"]
POLICIES: tuple[Policy, ...] = ("stop", "repeat", "resample")
_CACHED_PERMUTATIONS = 256  # Feistel keys held: a batch touches one or two per source


def apportion(weights: Sequence[float], total: int) -> list[int]:
    """Split ``total`` in proportion to ``weights`` by the largest remainder method.

    Exact (rational arithmetic on the weights as given): each share is its quota rounded down,
    and the units left go to the largest fractional parts, ties to the lower index. The shares
    sum to ``total``; a zero weight gets zero.
    """
    exact = [Fraction(w) for w in weights]
    if not exact or any(w < 0 for w in exact) or sum(exact) == 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(weights)}")
    if total < 0:
        raise ValueError(f"need a total >= 0, got {total}")
    scale = sum(exact)
    quotas = [w * total / scale for w in exact]
    shares = [int(q) for q in quotas]  # floor: quotas are >= 0
    left = total - sum(shares)
    by_remainder = sorted(range(len(quotas)), key=lambda s: (-(quotas[s] - shares[s]), s))
    for s in by_remainder[:left]:
        shares[s] += 1
    return shares


def _derived_seed(*words: int) -> int:
    """A seed for one use of ``seed`` (the position shuffle, one source's passes), so that the
    mix's permutations share no key with a ShuffleSampler given the same seed."""
    state = np.random.SeedSequence(list(words)).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def _keyed_hash(values: np.ndarray, key: int) -> np.ndarray:
    # the resample policy's draws with replacement: splitmix64 of (value + key)
    return splitmix64(values.astype(np.uint64) + np.uint64(key))


class MixPlan:
    """The arithmetic of a mix of sources of ``sizes`` samples, drawing ``counts`` per epoch.

    :meth:`locate` maps an epoch and positions to ``(source, sample)`` arrays; :meth:`check_epoch`
    raises :class:`SourceExhaustedError` for an epoch the ``"stop"`` policy cannot fill. The plan
    holds only the counts and a small cache of Feistel keys: it pickles to DataLoader workers.
    """

    def __init__(self, sizes: Sequence[int], counts: Sequence[int], policy: Policy, seed: int):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
        if seed < 0:
            raise ValueError(f"need seed >= 0, got {seed}")
        if len(sizes) != len(counts):
            raise ValueError(f"{len(sizes)} sources but {len(counts)} counts")
        for s, (n, c) in enumerate(zip(sizes, counts, strict=True)):
            if c < 0:
                raise ValueError(f"source {s}: need a count >= 0, got {c}")
            if c and not n:
                raise ValueError(f"source {s} is empty but the mix draws {c} samples from it")
        self.sizes = [int(n) for n in sizes]
        self.counts = [int(c) for c in counts]
        self.policy = policy
        self.seed = seed
        self.epoch_size = sum(self.counts)
        self._ends = np.cumsum(self.counts, dtype=np.int64)
        self._starts = self._ends - np.asarray(self.counts, dtype=np.int64)
        self._position_seed = _derived_seed(seed, 0x6D6978)
        self._source_seeds = [_derived_seed(seed, 0x737263, s) for s in range(len(sizes))]
        # pickled without entries: a worker makes its own keys (cheap)
        self._perms: BudgetCache[tuple[int, int], FeistelPermutation] = BudgetCache(
            _CACHED_PERMUTATIONS
        )

    def epochs_available(self, source: int) -> int | None:
        """How many epochs the ``"stop"`` policy can fill from ``source`` (None: no limit)."""
        c = self.counts[source]
        return None if self.policy != "stop" or not c else self.sizes[source] // c

    def check_epoch(self, epoch: int) -> None:
        """Raise unless every source can serve ``epoch`` under the policy."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        for s in range(len(self.sizes)):
            last = self.epochs_available(s)
            if last is not None and epoch >= last:
                raise SourceExhaustedError(s, self.sizes[s], self.counts[s], epoch)

    def _perm(self, key: int, n: int, seed: int, round_: int) -> FeistelPermutation:
        # key: -1 for the position shuffle, else the source; round_: the epoch, else the pass
        found = self._perms.get((key, round_))
        if found is None:
            found = FeistelPermutation(n, seed, round_)
            self._perms.put((key, round_), found, 1)  # each counts 1: the budget is a count
        return found

    def _samples(self, source: int, draws: np.ndarray) -> np.ndarray:
        """The sample index of each of ``source``'s draws (numbered across epochs)."""
        n = self.sizes[source]
        passes, offsets = np.divmod(draws, n)
        out = np.empty_like(draws)
        for p in np.unique(passes).tolist():
            here = passes == p
            if p and self.policy == "resample":
                out[here] = (
                    _keyed_hash(draws[here], self._source_seeds[source]) % np.uint64(n)
                ).astype(np.int64)
            elif self.counts[source] % n == 0:
                # The epoch draws whole passes: the position shuffle already puts each of the
                # pass's samples at a random place, and a second permutation would only cost.
                out[here] = offsets[here]
            else:
                out[here] = self._perm(source, n, self._source_seeds[source], p)(offsets[here])
        return out

    def locate(self, epoch: int, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(sources, samples)``: what positions ``positions`` (in ``[0, epoch_size)``) of
        ``epoch`` hold, as int64 arrays; the caller checks the range and :meth:`check_epoch`."""
        q = np.asarray(positions, dtype=np.int64).reshape(-1)
        shuffled = self._perm(-1, self.epoch_size, self._position_seed, epoch)(q)
        sources = np.searchsorted(self._ends, shuffled, side="right")
        counts = np.asarray(self.counts, dtype=np.int64)
        draws = epoch * counts[sources] + (shuffled - self._starts[sources])
        samples = np.empty_like(q)
        for s in np.unique(sources).tolist():
            here = sources == s
            samples[here] = self._samples(s, draws[here])
        return sources, samples
