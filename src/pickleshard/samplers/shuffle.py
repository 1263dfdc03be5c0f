"""``ShuffleSampler``: an exact global shuffle from ``(seed, epoch)``, in memory independent of N.

The epoch's order is a keyed bijection ``perm`` of ``[0, N)``, computed on the fly in numpy chunks
and never stored: a balanced Feistel network on ``2h`` bits (``4**h >= N``, six rounds, round keys
from ``numpy.random.SeedSequence([seed, epoch])``), restricted to ``[0, N)`` by cycle walking
(re-encrypt while the value is ``>= N``: fewer than 4 encryptions per value on average). Position
``q`` of the epoch holds sample ``perm(q mod N)``: positions ``>= N`` wrap around and serve as
padding.

A pass starts at position ``p`` (``samples_seen`` of a loaded state, else 0). Rank ``r`` of
``world_size`` ``W`` takes positions ``p + r, p + r + W, p + r + 2W, ...``: ``ceil((N - p) / W)``
of them (the last round padded by wrapping) or, with ``drop_last``, ``(N - p) // W``. Ranks move
in lockstep (DDP steps them together), so after each rank has taken ``j`` samples, exactly the
positions ``[p, p + j * W)`` have been consumed: ``samples_seen = min(N, p + j * W)`` is a global
fact, and a pass resumed from it with any world size covers the rest of the epoch exactly once.

DataLoader workers need nothing from the sampler: a map-style DataLoader draws batches from it in
the main process and sends batch ``b`` to worker ``b % num_workers``, so each worker gets
consecutive batches of the rank's stream, and the number of workers never changes the order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sized
from typing import Any

import numpy as np

from ..picklekit.compiled import CORE
from .base import POSITION_KEYS, ResumableSampler

__all__ = ["FeistelPermutation", "ShuffleSampler", "sampler_state_from_loader", "splitmix64"]

ROUNDS = 6
STATE_KEYS = frozenset(POSITION_KEYS)
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of the uint64 values ``z``: every output bit depends on every
    input bit (the Feistel rounds' mixing function, and any other keyed hash of indices)."""
    z = z * _M1
    z ^= z >> np.uint64(30)
    z *= _M2
    z ^= z >> np.uint64(27)
    z *= _M3
    z ^= z >> np.uint64(31)
    return z


class FeistelPermutation:
    """A keyed bijection of ``[0, n)`` evaluated on numpy arrays, in O(1) memory per value.

    ``perm(positions)`` returns ``perm[positions]`` as int64 for any int array of values in
    ``[0, n)``; the same ``(n, seed, epoch)`` always gives the same permutation, and different
    ``(seed, epoch)`` give unrelated ones. ``seed`` and ``epoch`` must be ``>= 0``.
    """

    def __init__(self, n: int, seed: int, epoch: int) -> None:
        if n < 0 or seed < 0 or epoch < 0:
            raise ValueError(f"need n, seed, epoch >= 0, got {n}, {seed}, {epoch}")
        self.n = n
        self.half_bits = max(1, math.ceil((n - 1).bit_length() / 2)) if n > 1 else 1
        self._mask = np.uint64((1 << self.half_bits) - 1)
        self._shift = np.uint64(self.half_bits)
        self._keys = np.random.SeedSequence([seed, epoch]).generate_state(ROUNDS, dtype=np.uint64)

    def _round(self, right: np.ndarray, key: np.uint64) -> np.ndarray:
        out: np.ndarray = splitmix64(right ^ key) & self._mask
        return out

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._shift, x & self._mask
        for key in self._keys:
            left, right = right, left ^ self._round(right, key)
        out: np.ndarray = (left << self._shift) | right
        return out

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """``perm[positions]`` (int64, the shape of ``positions``), by the compiled core where it
        is built, else by :meth:`reference`."""
        if CORE is None:
            return self.reference(positions)
        flat = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
        out = np.empty(len(flat), np.int64)
        CORE.feistel_permute(flat, self._keys, self.half_bits, self.n, out)
        return out.reshape(np.shape(positions))

    def reference(self, positions: np.ndarray) -> np.ndarray:
        """``perm[positions]`` in numpy: the definition the compiled permutation is held to."""
        x = np.asarray(positions, dtype=np.uint64)
        y = self._encrypt(x)
        walking = np.flatnonzero(y >= np.uint64(self.n))
        while walking.size:  # cycle walking: a value outside [0, n) is encrypted again
            y[walking] = self._encrypt(y[walking])
            walking = walking[y[walking] >= np.uint64(self.n)]
        return y.astype(np.int64)


class ShuffleSampler(ResumableSampler):
    """Every sample of ``dataset`` once per epoch, in an exact global shuffle, split across ranks.

    ``dataset`` is anything with ``__len__`` (a :class:`pickleshard.PickleDataset` or any map-style
    dataset); its length is read once, here. The order is a pure function of ``(seed, epoch)``
    (see the module docstring); ``shuffle=False`` uses the identity order instead. ``rank``/
    ``world_size`` default to ``torch.distributed``'s when initialised, else 0/1.

    Like ``torch.utils.data.DistributedSampler``: :meth:`set_epoch` before each epoch; ``len()``
    is a full epoch's count for this rank, ``ceil(N / world_size)`` (padded by wrapping to the start
    of the epoch's order) or ``N // world_size`` with ``drop_last``. Memory is a few chunks of
    ``chunk_size`` int64 values whatever N is.

    Resume (see :class:`~pickleshard.samplers.base.ResumableSampler`): the state is
    ``{"seed", "epoch", "samples_seen"}``, ``samples_seen`` being the global number of positions of
    the epoch consumed by all ranks together (see the module docstring), so a state loads into a
    sampler with another rank and world size than the saving run's. Pass the sampler as
    ``sampler=`` to ``StatefulDataLoader`` and it resumes mid-epoch unchanged.
    """

    def __init__(
        self,
        dataset: Sized,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        chunk_size: int = 8192,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"need chunk_size >= 1, got {chunk_size}")
        super().__init__(
            len(dataset),
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )
        self.chunk_size = chunk_size

    def _rank_count(self, start: int) -> int:
        left = self.num_samples_total - start
        return left // self.world_size if self.drop_last else -(-left // self.world_size)

    def __len__(self) -> int:
        return self._rank_count(0)

    def _max_samples_seen(self) -> int:
        return self.num_samples_total

    def _stream(self, state: dict[str, Any]) -> Iterator[int]:
        n, start = self.num_samples_total, state["samples_seen"]
        count = self._rank_count(start)
        perm = FeistelPermutation(n, state["seed"], state["epoch"]) if self.shuffle and n else None
        for first in range(0, count, self.chunk_size):
            j = np.arange(first, min(count, first + self.chunk_size), dtype=np.int64)
            positions = (start + self.rank + j * self.world_size) % n
            yield from (positions if perm is None else perm(positions)).tolist()

    def _state_after(self, state: dict[str, Any], taken: int) -> dict[str, Any]:
        seen = min(self.num_samples_total, state["samples_seen"] + taken * self.world_size)
        return {**state, "samples_seen": seen}


def sampler_state_from_loader(loader_state: Mapping[str, Any]) -> dict[str, int]:
    """The :class:`ShuffleSampler` state inside a ``StatefulDataLoader.state_dict()``.

    Use it to resume with a different world size or number of workers, which the loader's own
    ``load_state_dict`` refuses: build a fresh sampler and loader, and call
    ``sampler.load_state_dict(sampler_state_from_loader(saved))``. The state found is exact for
    ``num_workers=0``, and for worker processes when the loader snapshots every step
    (``snapshot_every_n_steps=1``, the default); otherwise ValueError, as for no or several states.
    """
    if loader_state.get("_steps_since_snapshot", 0) != 0:
        raise ValueError(
            "the loader's state is a snapshot plus steps replayed after it: save it with "
            "snapshot_every_n_steps=1 to resume with a different world size or worker count"
        )
    found: list[dict[str, int]] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if set(node) == STATE_KEYS:
                found.append({k: int(node[k]) for k in POSITION_KEYS})
                return
            for value in node.values():
                walk(value)

    walk(loader_state)
    if len({tuple(sorted(s.items())) for s in found}) != 1:
        raise ValueError(f"expected one ShuffleSampler state in the loader state, found {found}")
    return found[0]
