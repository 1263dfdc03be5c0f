"""The resume kit: the one checker every stateful sampler passes, and the id-labelled data it
runs on (:func:`write_id_files`). It needs ``pytest``; the loaders :func:`check_loader_resume`
checks are the caller's to build.

Modelled on torchdata.nodes' ``run_test_save_load_state``: for a sampler factory, a pass saved
after ``k`` samples and resumed in a fresh sampler must yield exactly the rest of the epoch; the
state must survive JSON; a resumed pass must not leak into the next epoch; and restarting from the
state at the start or at the end of an epoch must work. :func:`check_rescaled_resume` resumes a
state on another world size or worker count (or checks that the sampler refuses it, for one whose
order depends on them). :func:`check_loader_resume` does the same through ``torchdata``'s
``StatefulDataLoader``, batch by batch.
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytest


class StatefulSampler(Protocol):
    def __iter__(self) -> Any: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def write_id_files(folder: Path, sizes: Sequence[int], dim: int = 2) -> int:
    """Write ``part-00000.pkl``, ... as ``pickle.dump((x_list, y_list))`` where each ``y`` is the
    sample's global index (files sort by name, so it is also its index in a PickleDataset) and
    ``x`` a float32 array of ``dim`` values equal to it. Return the number of samples."""
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for f, n in enumerate(sizes):
        ids = list(range(start, start + n))
        xs = [np.full(dim, i, dtype=np.float32) for i in ids]
        with open(folder / f"part-{f:05d}.pkl", "wb") as fh:
            pickle.dump((xs, ids), fh, protocol=5)
        start += n
    return start


def _json_round_trip(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    assert out == state, "state_dict must be plain JSON data"
    return out


def _take(it: Any, k: int) -> list[int]:
    return [next(it) for _ in range(k)]


def check_resume(make: Callable[[], StatefulSampler], stops: Iterable[int], epoch: int = 0) -> None:
    """Hold the sampler that ``make()`` builds to the resume contract at each of ``stops``.

    ``stops`` are sample counts within one pass of ``epoch``; values past the pass are clamped.
    """
    reference = make()
    reference.set_epoch(epoch)
    full = list(reference)
    reference.set_epoch(epoch + 1)
    following = list(reference)

    for stop in sorted({min(max(0, s), len(full)) for s in stops}):
        first = make()
        first.set_epoch(epoch)
        it = iter(first)
        head = _take(it, stop)
        state = _json_round_trip(first.state_dict())

        resumed = make()
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state, "a loaded state is reported until a pass starts"
        resumed.set_epoch(epoch)  # the usual loop calls set_epoch before iterating: no effect
        iter(resumed)  # DataLoaders make iterators they never use: they must not eat the state
        tail = list(resumed)
        assert head + tail == full, f"resume after {stop} samples"

        # The resumed pass ends the epoch; the next pass is a fresh one of the next epoch.
        resumed.set_epoch(epoch + 1)
        assert list(resumed) == following, f"epoch after a resume at {stop}"

        # Restart from the state saved at the end of the first pass: an empty rest.
        list(it)
        end_state = _json_round_trip(first.state_dict())
        restarted = make()
        restarted.load_state_dict(end_state)
        assert list(restarted) == []
        restarted.set_epoch(epoch + 1)
        assert list(restarted) == following


def check_rescaled_resume(
    make: Callable[[int, int, int], StatefulSampler],
    num_samples: int,
    *,
    before: tuple[int, int],
    after: tuple[int, int],
    stops: Iterable[int],
    rescales: bool,
    epoch: int = 0,
) -> None:
    """Resume an epoch saved on ``before = (world_size, num_workers)`` on ``after``.

    ``make(rank, world_size, num_workers)`` builds one rank's sampler over ``num_samples``
    samples. For each ``stop``, every rank of ``before`` takes ``stop`` samples of ``epoch`` in
    lockstep (as DDP steps them) and saves its state: the states must be equal, since a state is
    the epoch's position, not one rank's. Then, when ``rescales`` or ``before == after``, every
    rank of ``after`` loads that state and runs its rest: together with what was taken, each
    sample is seen, repeats are padding only and samples missed are ``drop_last``'s only (fewer
    than one per rank of each world). A sampler that does not rescale must refuse the state on
    another world size or worker count with a ValueError saying it cannot resume.
    """
    (world0, workers0), (world1, workers1) = before, after
    for stop in stops:
        taken: list[int] = []
        states = []
        for rank in range(world0):
            sampler = make(rank, world0, workers0)
            sampler.set_epoch(epoch)
            it = iter(sampler)
            taken += [i for i in (next(it, None) for _ in range(max(0, stop))) if i is not None]
            states.append(_json_round_trip(sampler.state_dict()))
        assert all(st == states[0] for st in states), "ranks in lockstep share one state"
        if not rescales and before != after:
            with pytest.raises(ValueError, match="cannot resume"):
                make(0, world1, workers1).load_state_dict(states[0])
            continue
        rest: list[int] = []
        for rank in range(world1):
            sampler = make(rank, world1, workers1)
            sampler.set_epoch(epoch + 1)  # the loaded state's epoch wins for the resumed pass
            sampler.load_state_dict(states[0])
            rest += list(sampler)
        seen = Counter(taken + rest)
        assert set(seen) <= set(range(num_samples)), "indices out of range"
        slack = (world0 - 1) + (world1 - 1)
        repeats = sum(c - 1 for c in seen.values())
        missing = num_samples - len(seen)
        assert repeats <= slack, f"{repeats} repeats after a resume at {stop}: not padding"
        assert missing <= slack, f"{missing} samples missed after a resume at {stop}"
        assert not (repeats and missing), "padding and dropping in one epoch"


def loader_ids(batches: Iterable[Any]) -> list[int]:
    """The ``y`` ids of the ``(x, y)`` batches a DataLoader yields, in order."""
    return [i for batch in batches for i in batch[1].tolist()]


def check_loader_resume(make: Callable[[], Any], stops: Iterable[int]) -> None:
    """``make()`` builds a ``StatefulDataLoader`` over id-labelled data (see
    :func:`write_id_files`) with ``sampler.set_epoch`` reachable as ``loader.sampler``. For each
    ``stop`` (a batch count), two epochs split at ``stop`` batches of the first, or of the second
    when ``stop`` is past the first, must equal the same two epochs run straight through; and so
    must a restart from the state saved after the first epoch finished."""
    straight = make()
    epochs: list[list[int]] = []
    for epoch in (0, 1):
        straight.sampler.set_epoch(epoch)
        epochs.append(loader_ids(straight))
    per_epoch = len(straight)

    for stop in stops:
        epoch, k = divmod(stop, per_epoch) if stop < 2 * per_epoch else (1, per_epoch)
        first = make()
        seen: list[list[int]] = [[], []]
        for e in range(epoch):
            first.sampler.set_epoch(e)
            seen[e] = loader_ids(first)
        first.sampler.set_epoch(epoch)
        it = iter(first)
        seen[epoch] = loader_ids(next(it) for _ in range(k))
        state = first.state_dict()
        del it, first

        second = make()
        second.load_state_dict(state)
        for e in range(epoch, 2):
            second.sampler.set_epoch(e)
            seen[e] += loader_ids(second)
        assert seen == epochs, f"loader resumed after {stop} batches"

    # A state saved once the first epoch has finished resumes as the start of the second.
    first = make()
    first.sampler.set_epoch(0)
    assert loader_ids(first) == epochs[0]
    state = first.state_dict()
    second = make()
    second.load_state_dict(state)
    second.sampler.set_epoch(1)
    assert loader_ids(second) == epochs[1], "loader resumed from a finished epoch"
