"""``SamplerPass``: one resumable pass over a sampler's epoch, the iterator both samplers return.

Why the pass, not the sampler, holds the position: DataLoaders call ``iter(sampler)`` more often
than once per epoch and drop some of the iterators unused (torch's multi-process iterator calls
it in ``__init__`` and again in ``_reset``; ``StatefulDataLoader`` makes one more to load a state,
and a fresh one when the loaded state says the epoch had finished). So:

- ``StatefulDataLoader`` saves and loads the state of the pass it is using (its batch sampler
  iterator calls ``state_dict``/``load_state_dict`` on both the sampler and the pass); a loaded
  pass is positioned at once, and a pass made afterwards starts a fresh epoch, as it should.
- ``sampler.load_state_dict(state)`` with a plain loop or loader leaves the state *pending*: the
  first pass to yield a sample starts there, so the iterators made and dropped before do no harm.

A pass is a stateful node with torchdata.nodes' hooks: :meth:`reset`, :meth:`next`,
:meth:`get_state`, wrapped by ``__next__``, ``state_dict`` and ``load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

__all__ = ["PassSource", "SamplerPass"]


class PassSource(Protocol):
    """What a sampler provides to its passes. States are plain dicts with at least ``epoch``
    and ``samples_seen``; the sampler decides what ``samples_seen`` counts."""

    _pending: dict[str, Any] | None

    def _fresh_state(self) -> dict[str, Any]:
        """The state at the start of the sampler's current epoch."""
        ...

    def _checked(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` as a dict if this sampler can resume it, else ValueError."""
        ...

    def _stream(self, state: dict[str, Any]) -> Iterator[int]:
        """The sample indices that remain after ``state``, in order."""
        ...

    def _state_after(self, state: dict[str, Any], taken: int) -> dict[str, Any]:
        """The state once ``taken`` more samples have been yielded from ``state``."""
        ...


class SamplerPass(Iterator[int]):
    """The samples of one epoch (or of its rest, when resumed) from ``source``.

    Until it yields or is reset, a pass has not started: :meth:`get_state` then reports where it
    would start (the sampler's pending state, or the start of its epoch). On its first
    :meth:`next` it takes and clears the sampler's pending state, if any.
    """

    def __init__(self, source: PassSource) -> None:
        self._source = source
        self._start: dict[str, Any] | None = None
        self._stream: Iterator[int] = iter(())
        self._taken = 0

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        """Start over at ``initial_state`` (checked by the sampler), else at the epoch's start."""
        src = self._source
        self._start = src._fresh_state() if initial_state is None else src._checked(initial_state)
        self._stream = src._stream(self._start)
        self._taken = 0

    def next(self) -> int:
        """The next sample index; StopIteration at the end of the pass."""
        if self._start is None:
            pending, self._source._pending = self._source._pending, None
            self.reset(pending)
        i = next(self._stream)
        self._taken += 1
        return i

    def get_state(self) -> dict[str, Any]:
        if self._start is None:
            return dict(self._source._pending or self._source._fresh_state())
        return self._source._state_after(self._start, self._taken)

    __next__ = next  # the hook is the protocol method: one call per sample, not two

    def state_dict(self) -> dict[str, Any]:
        return self.get_state()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Position this pass at ``state_dict``; the sampler's pending state is now spent."""
        self.reset(state_dict)
        self._source._pending = None
