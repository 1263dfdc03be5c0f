"""``ResumableSampler``: the one resumable sampler base, and ``SamplerPass``, the pass it returns.

A sampler's position is a plain dict, its *state*: ``{"seed", "epoch", "samples_seen"}`` plus the
sampler's own settings that shape the order (:meth:`ResumableSampler._settings`, empty when the
order does not depend on any). The base writes ``__iter__``, ``set_epoch``, ``state_dict``,
``load_state_dict`` and the checks of a loaded state once; a sampler writes only, in the style of
torchdata.nodes' ``reset``/``next``/``get_state``:

- ``_stream(state)``: the sample indices that remain after ``state``, in order (the pass's
  ``next`` draws from it; a pass ``reset`` to a state asks for a new stream);
- ``_state_after(state, taken)``: the state once ``taken`` more samples have been yielded
  (the pass's ``get_state``); the sampler decides what ``samples_seen`` counts;
- ``_settings()`` and ``_max_samples_seen()``: what a state must match, and how far it may go;
- ``__len__``.

Why the pass, not the sampler, holds the position: DataLoaders call ``iter(sampler)`` more often
than once per epoch and drop some of the iterators unused (torch's multi-process iterator calls
it in ``__init__`` and again in ``_reset``; ``StatefulDataLoader`` makes one more to load a state,
and a fresh one when the loaded state says the epoch had finished). So:

- ``StatefulDataLoader`` saves and loads the state of the pass it is using (its batch sampler
  iterator calls ``state_dict``/``load_state_dict`` on both the sampler and the pass); a loaded
  pass is positioned at once, and a pass made afterwards starts a fresh epoch, as it should.
- ``sampler.load_state_dict(state)`` with a plain loop or loader leaves the state *pending*: the
  first pass to yield a sample starts there, so the iterators made and dropped before do no harm.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any, Generic, TypeVar

try:  # a real torch Sampler when torch is there (isinstance checks, typing); plain class if not
    from torch.utils.data import Sampler as _SamplerBase
except ImportError:  # pragma: no cover - exercised only without torch
    # generic, as torch's is: the class statement below subscripts it
    _T = TypeVar("_T")

    class _SamplerBase(Generic[_T]):  # type: ignore[no-redef]
        """Stands in for ``torch.utils.data.Sampler``."""


__all__ = ["POSITION_KEYS", "ResumableSampler", "SamplerPass", "distributed_rank_and_world"]

POSITION_KEYS = ("seed", "epoch", "samples_seen")


def distributed_rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill in ``rank``/``world_size`` from ``torch.distributed`` when it is initialised, else 0/1."""
    if rank is not None and world_size is not None:
        resolved = (rank, world_size)
    else:
        auto_rank, auto_world = 0, 1
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                auto_rank, auto_world = dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
        resolved = (
            auto_rank if rank is None else rank,
            auto_world if world_size is None else world_size,
        )
    if resolved[1] < 1 or not 0 <= resolved[0] < resolved[1]:
        raise ValueError(
            f"need 0 <= rank < world_size, got rank={resolved[0]}, world_size={resolved[1]}"
        )
    return resolved


class ResumableSampler(_SamplerBase[int]):
    """A sampler of ``num_samples`` indices whose order is a pure function of its state.

    ``seed`` must be ``>= 0``; ``rank``/``world_size`` default to ``torch.distributed``'s when
    initialised, else 0/1. :meth:`set_epoch` before each epoch, as with ``DistributedSampler``.

    :meth:`state_dict` is the pending loaded state, else the current pass's, else the start of
    :attr:`epoch`. :meth:`load_state_dict` checks the state (ValueError if it is not this
    sampler's kind, if a setting in :meth:`_settings` differs, or if ``samples_seen`` is past
    :meth:`_max_samples_seen`) and makes the next pass that yields resume there; it sets
    :attr:`seed` but not :attr:`epoch`, so later fresh passes follow :meth:`set_epoch`.
    ``iter(sampler)`` returns a :class:`SamplerPass`, whose own state
    ``torchdata.stateful_dataloader.StatefulDataLoader`` saves and restores.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        shuffle: bool,
        seed: int,
        rank: int | None,
        world_size: int | None,
        drop_last: bool,
    ) -> None:
        if seed < 0:
            raise ValueError(f"need seed >= 0, got {seed}")
        self.num_samples_total = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size = distributed_rank_and_world(rank, world_size)
        self.drop_last = drop_last
        self.epoch = 0
        self._pending: dict[str, Any] | None = None
        self._current: SamplerPass | None = None

    # The hooks a sampler writes.

    def _settings(self) -> dict[str, Any]:
        """Settings a state records and a resuming sampler must share (the order depends on them)."""
        return {}

    def _max_samples_seen(self) -> int:
        """The largest ``samples_seen`` a state of this sampler can hold."""
        raise NotImplementedError

    def _stream(self, state: dict[str, Any]) -> Iterator[int]:
        """The sample indices that remain after ``state``, in order."""
        raise NotImplementedError

    def _state_after(self, state: dict[str, Any], taken: int) -> dict[str, Any]:
        """The state once ``taken`` more samples have been yielded from ``state``."""
        raise NotImplementedError

    # Written once, for every sampler.

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for passes that do not resume a loaded state."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch

    def __iter__(self) -> SamplerPass:
        self._current = SamplerPass(self)
        return self._current

    def state_dict(self) -> dict[str, Any]:
        """The pending loaded state, else the current pass's, else the start of :attr:`epoch`."""
        if self._pending is not None:
            return dict(self._pending)
        return self._fresh_state() if self._current is None else self._current.get_state()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Make the next pass resume at ``state_dict``; ValueError if it cannot be resumed here."""
        self._pending = self._checked(state_dict)
        self.seed = self._pending["seed"]

    def _fresh_state(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "samples_seen": 0, **self._settings()}

    def _checked(self, state: Mapping[str, Any]) -> dict[str, Any]:
        name = type(self).__name__
        settings = self._settings()
        if set(state) != {*POSITION_KEYS, *settings} or not all(
            isinstance(state[k], int) and state[k] >= 0 for k in POSITION_KEYS
        ):
            raise ValueError(f"not a {name} state: {dict(state)!r}")
        theirs = {k: state[k] for k in settings}
        if theirs != settings:
            raise ValueError(
                f"cannot resume a {name} saved with {theirs} as one with {settings}: "
                "the order depends on them"
            )
        limit = self._max_samples_seen()
        if state["samples_seen"] > limit:
            raise ValueError(
                f"state has samples_seen={state['samples_seen']}, but a pass of this {name} "
                f"takes at most {limit} samples: it comes from another dataset"
            )
        return {**{k: int(state[k]) for k in POSITION_KEYS}, **settings}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={self.num_samples_total}, seed={self.seed}, "
            f"epoch={self.epoch}, rank={self.rank}, world_size={self.world_size}, "
            f"drop_last={self.drop_last})"
        )


class SamplerPass(Iterator[int]):
    """The samples of one epoch (or of its rest, when resumed) from ``sampler``.

    A stateful node with torchdata.nodes' hooks: :meth:`reset`, :meth:`next`, :meth:`get_state`,
    wrapped by ``__next__``, ``state_dict`` and ``load_state_dict``. Until it yields or is reset,
    a pass has not started: :meth:`get_state` then reports where it would start (the sampler's
    pending state, or the start of its epoch). On its first :meth:`next` it takes and clears the
    sampler's pending state, if any.
    """

    def __init__(self, sampler: ResumableSampler) -> None:
        self._sampler = sampler
        self._start: dict[str, Any] | None = None
        self._stream: Iterator[int] = iter(())
        self._taken = 0

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        """Start over at ``initial_state`` (checked by the sampler), else at the epoch's start."""
        s = self._sampler
        self._start = s._fresh_state() if initial_state is None else s._checked(initial_state)
        self._stream = s._stream(self._start)
        self._taken = 0

    def next(self) -> int:
        """The next sample index; StopIteration at the end of the pass."""
        if self._start is None:
            pending, self._sampler._pending = self._sampler._pending, None
            self.reset(pending)
        i = next(self._stream)
        self._taken += 1
        return i

    def get_state(self) -> dict[str, Any]:
        if self._start is None:
            return dict(self._sampler._pending or self._sampler._fresh_state())
        return self._sampler._state_after(self._start, self._taken)

    __next__ = next  # the hook is the protocol method: one call per sample, not two

    def take(self, n: int) -> list[int]:
        """The next ``n`` sample indices (fewer at the end of the pass, none after it), as
        ``n`` calls of :meth:`next` would give: a batch drawn without a Python call a sample."""
        if self._start is None:
            pending, self._sampler._pending = self._sampler._pending, None
            self.reset(pending)
        got = list(islice(self._stream, n))
        self._taken += len(got)
        return got

    def state_dict(self) -> dict[str, Any]:
        return self.get_state()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Position this pass at ``state_dict``; the sampler's pending state is now spent."""
        self.reset(state_dict)
        self._sampler._pending = None
