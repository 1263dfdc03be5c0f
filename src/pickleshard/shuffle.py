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

try:  # a real torch Sampler when torch is there (isinstance checks, typing); plain class if not
    from torch.utils.data import Sampler as _SamplerBase
except ImportError:  # pragma: no cover - exercised only without torch
    _SamplerBase = object  # type: ignore[assignment,misc]

from .passes import SamplerPass
from .sampling import distributed_rank_and_world

__all__ = ["FeistelPermutation", "ShuffleSampler", "sampler_state_from_loader"]

ROUNDS = 6
STATE_KEYS = frozenset({"seed", "epoch", "samples_seen"})
_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


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
        # splitmix64's finaliser of (right ^ key): every output bit depends on every input bit.
        z = (right ^ key) * _M1
        z ^= z >> np.uint64(30)
        z *= _M2
        z ^= z >> np.uint64(27)
        z *= _M3
        z ^= z >> np.uint64(31)
        out: np.ndarray = z & self._mask
        return out

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._shift, x & self._mask
        for key in self._keys:
            left, right = right, left ^ self._round(right, key)
        out: np.ndarray = (left << self._shift) | right
        return out

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        x = np.asarray(positions, dtype=np.uint64)
        y = self._encrypt(x)
        walking = np.flatnonzero(y >= np.uint64(self.n))
        while walking.size:  # cycle walking: a value outside [0, n) is encrypted again
            y[walking] = self._encrypt(y[walking])
            walking = walking[y[walking] >= np.uint64(self.n)]
        return y.astype(np.int64)


class ShuffleSampler(_SamplerBase[int]):
    """Every sample of ``dataset`` once per epoch, in an exact global shuffle, split across ranks.

    ``dataset`` is anything with ``__len__`` (a :class:`pickleshard.PickleDataset` or any map-style
    dataset); its length is read once, here. The order is a pure function of ``(seed, epoch)``
    (see the module docstring); ``shuffle=False`` uses the identity order instead. ``rank``/
    ``world_size`` default to ``torch.distributed``'s when initialised, else 0/1.

    Like ``torch.utils.data.DistributedSampler``: :meth:`set_epoch` before each epoch; ``len()``
    is a full epoch's count for this rank, ``ceil(N / world_size)`` (padded by wrapping to the start
    of the epoch's order) or ``N // world_size`` with ``drop_last``. Memory is a few chunks of
    ``chunk_size`` int64 values whatever N is.

    Resume: :meth:`state_dict` is ``{"seed", "epoch", "samples_seen"}``, ``samples_seen`` being the
    global number of positions of the epoch consumed by all ranks together (see the module
    docstring). :meth:`load_state_dict` makes the next pass that yields start there, with this
    sampler's own rank and world size, which may differ from the saving run's; it sets ``seed``
    but not :attr:`epoch`, so later fresh passes follow :meth:`set_epoch`. ``iter(sampler)``
    returns a :class:`~pickleshard.passes.SamplerPass`, whose own state is what
    ``torchdata.stateful_dataloader.StatefulDataLoader`` saves and restores: pass the sampler as
    ``sampler=`` and it resumes mid-epoch unchanged.
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
        if seed < 0 or chunk_size < 1:
            raise ValueError(f"need seed >= 0 and chunk_size >= 1, got {seed}, {chunk_size}")
        self.num_samples_total = len(dataset)
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size = distributed_rank_and_world(rank, world_size)
        self.drop_last = drop_last
        self.chunk_size = chunk_size
        self.epoch = 0
        self._pending: dict[str, Any] | None = None
        self._current: SamplerPass | None = None

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for passes that do not resume a loaded state."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch

    def _rank_count(self, start: int) -> int:
        left = self.num_samples_total - start
        return left // self.world_size if self.drop_last else -(-left // self.world_size)

    def __len__(self) -> int:
        return self._rank_count(0)

    def __iter__(self) -> SamplerPass:
        self._current = SamplerPass(self)
        return self._current

    def state_dict(self) -> dict[str, int]:
        """The pending loaded state, else the current pass's, else the start of :attr:`epoch`."""
        if self._pending is not None:
            return dict(self._pending)
        return self._fresh_state() if self._current is None else self._current.get_state()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Make the next pass resume at ``state_dict``; ValueError if it is not one of ours."""
        self._pending = self._checked(state_dict)
        self.seed = self._pending["seed"]

    # What a SamplerPass asks of its sampler.

    def _fresh_state(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "samples_seen": 0}

    def _checked(self, state: Mapping[str, Any]) -> dict[str, Any]:
        if set(state) != STATE_KEYS or not all(
            isinstance(state[k], int) and state[k] >= 0 for k in STATE_KEYS
        ):
            raise ValueError(f"not a ShuffleSampler state: {dict(state)!r}")
        if state["samples_seen"] > self.num_samples_total:
            raise ValueError(
                f"state has samples_seen={state['samples_seen']} but the dataset has "
                f"{self.num_samples_total} samples: it comes from another dataset"
            )
        return {k: int(state[k]) for k in ("seed", "epoch", "samples_seen")}

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

    def __repr__(self) -> str:
        return (
            f"ShuffleSampler(n={self.num_samples_total}, seed={self.seed}, epoch={self.epoch}, "
            f"rank={self.rank}, world_size={self.world_size}, drop_last={self.drop_last})"
        )


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
                found.append({k: int(node[k]) for k in ("seed", "epoch", "samples_seen")})
                return
            for value in node.values():
                walk(value)

    walk(loader_state)
    if len({tuple(sorted(s.items())) for s in found}) != 1:
        raise ValueError(f"expected one ShuffleSampler state in the loader state, found {found}")
    return found[0]
