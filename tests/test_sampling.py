"""BlockShuffleSampler: coverage across ranks, determinism, and at most one load per file per worker.

A fake index (file sample counts and decoded sizes) keeps the property tests fast; the worker
replay runs the real :class:`~pickleshard.read.whole.cache.WholeFileCache` the dataset uses, with
every registered eviction policy that declares ``keeps_recent`` (what the sampler relies on).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pickleshard.io.lru import EVICTIONS, Eviction
from pickleshard.read.whole.cache import CacheBudget, WholeFileCache
from pickleshard.samplers import BlockShuffleSampler, distributed_rank_and_world
from pickleshard.scan.layouts import DecodedLayout


@dataclass(frozen=True)
class FakeFile:
    num_samples: int
    decoded_nbytes: int


@dataclass
class FakeIndex:
    files: list[FakeFile]
    file_starts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        counts = [f.num_samples for f in self.files]
        self.file_starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


@dataclass
class FakeDataset:
    index: FakeIndex
    cache_bytes: int


def _dataset(files: list[tuple[int, int]], cache_bytes: int) -> FakeDataset:
    return FakeDataset(FakeIndex([FakeFile(n, b) for n, b in files]), cache_bytes)


def _epoch(sampler: BlockShuffleSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def _file_of(ds: FakeDataset, i: int) -> int:
    return int(np.searchsorted(ds.index.file_starts, i, side="right")) - 1


def _replay_workers(
    ds: FakeDataset,
    order: list[int],
    batch_size: int,
    num_workers: int,
    eviction: Callable[[], Eviction[str]],
) -> dict[int, Counter[int]]:
    """Replay ``order`` as a DataLoader would: batch ``k`` goes to worker ``k % num_workers``,
    each worker has its own cache of ``cache_bytes // num_workers`` and, like
    ``PickleDataset.__getitems__``, visits a batch's files in order of first appearance.
    Return each worker's load count per file."""
    workers = max(1, num_workers)
    loads: dict[int, Counter[int]] = {w: Counter() for w in range(workers)}

    def loader_for(w: int) -> Callable[[str], DecodedLayout]:
        def load(path: str) -> DecodedLayout:
            loads[w][int(path)] += 1
            return DecodedLayout("columns", ("x",), ([None],))

        return load

    share = CacheBudget(ds.cache_bytes).share(num_workers)
    caches = [WholeFileCache(share, loader_for(w), eviction) for w in range(workers)]
    for k, start in enumerate(range(0, len(order), batch_size)):
        files = [_file_of(ds, i) for i in order[start : start + batch_size]]
        cache = caches[k % workers]
        for f in dict.fromkeys(files):
            cache.get(str(f), ds.index.files[f].decoded_nbytes)
    return loads


KEEPS_RECENT = [policy for policy in EVICTIONS.values() if policy.keeps_recent]

files_strategy = st.lists(
    st.tuples(st.integers(0, 12), st.integers(1, 100)), min_size=1, max_size=8
)


@settings(max_examples=150, deadline=None)
@given(
    files=files_strategy,
    cache_bytes=st.integers(0, 400),
    batch_size=st.integers(1, 8),
    num_workers=st.integers(0, 4),
    world_size=st.integers(1, 4),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 50),
)
def test_block_shuffle_properties(
    files: list[tuple[int, int]],
    cache_bytes: int,
    batch_size: int,
    num_workers: int,
    world_size: int,
    drop_last: bool,
    seed: int,
    epoch: int,
) -> None:
    ds = _dataset(files, cache_bytes)
    total = sum(n for n, _ in files)

    def sampler(rank: int) -> BlockShuffleSampler:
        return BlockShuffleSampler(
            ds,
            batch_size=batch_size,
            num_workers=num_workers,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )

    per_rank = [_epoch(sampler(r), epoch) for r in range(world_size)]

    # (a) equal lengths, as len() says; coverage and padding as DistributedSampler does it.
    expected_len = total // world_size if drop_last else math.ceil(total / world_size)
    for order in per_rank:
        assert len(order) == len(sampler(0)) == expected_len
        assert len(set(order)) == len(order)  # a rank never sees a sample twice
        assert all(0 <= i < total for i in order)
    counts = Counter(i for order in per_rank for i in order)
    handed_out = world_size * expected_len
    if drop_last:
        assert max(counts.values(), default=1) == 1
        assert total - len(counts) == total % world_size < world_size
    else:
        assert set(counts) == set(range(total))
        assert handed_out - total == sum(counts.values()) - total < world_size
        if total:
            low, high = handed_out // total, -(-handed_out // total)
            assert set(counts.values()) <= {low, high}
    if total % world_size == 0:
        assert counts == Counter(range(total))

    # (b) a pure function of (seed, epoch); another epoch gives another order.
    assert [_epoch(sampler(r), epoch) for r in range(world_size)] == per_rank
    if total >= 30:
        assert [_epoch(sampler(r), epoch + 1) for r in range(world_size)] != per_rank

    # (c) under the DataLoader's round-robin, each worker loads each file at most once.
    for order in per_rank:
        for eviction in KEEPS_RECENT:
            loads = _replay_workers(ds, order, batch_size, num_workers, eviction)
            for worker, per_file in loads.items():
                assert max(per_file.values(), default=0) <= 1, (eviction, worker, per_file)


def test_orders_differ_between_epochs_and_seeds() -> None:
    ds = _dataset([(20, 10)] * 10, cache_bytes=35)
    sampler = BlockShuffleSampler(ds, batch_size=4, num_workers=2, seed=1)
    first, second = _epoch(sampler, 0), _epoch(sampler, 1)
    assert sorted(first) == sorted(second) == list(range(200))
    assert first != second
    other_seed = BlockShuffleSampler(ds, batch_size=4, num_workers=2, seed=2)
    assert _epoch(other_seed, 0) != first


def test_windows_keep_samples_of_a_window_together() -> None:
    # budget for 2 files per worker: with one worker, every 2 * 10 consecutive samples come
    # from at most 2 files (the window being read), wherever the shuffle put them
    ds = _dataset([(10, 50)] * 6, cache_bytes=100)
    order = _epoch(BlockShuffleSampler(ds, batch_size=5, seed=3), 0)
    for start in range(0, 60, 20):
        assert len({_file_of(ds, i) for i in order[start : start + 20]}) == 2


def test_without_shuffle_the_order_is_the_file_order() -> None:
    ds = _dataset([(3, 1), (0, 1), (4, 1)], cache_bytes=100)
    sampler = BlockShuffleSampler(ds, shuffle=False)
    assert list(sampler) == list(range(7))
    ranks = [list(BlockShuffleSampler(ds, shuffle=False, rank=r, world_size=2)) for r in range(2)]
    assert ranks == [[0, 1, 2, 3], [4, 5, 6, 0]]  # padded by wrapping around


def test_empty_dataset_yields_nothing() -> None:
    ds = _dataset([(0, 1), (0, 1)], cache_bytes=10)
    sampler = BlockShuffleSampler(ds, batch_size=3, num_workers=2, world_size=2, rank=1)
    assert (len(sampler), list(sampler)) == (0, [])


def test_cache_bytes_defaults_to_the_datasets() -> None:
    ds = _dataset([(1, 1)], cache_bytes=1234)
    assert BlockShuffleSampler(ds).cache_bytes == 1234
    assert BlockShuffleSampler(ds, cache_bytes=5).cache_bytes == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"num_workers": -1},
        {"rank": 2, "world_size": 2},
        {"rank": -1, "world_size": 2},
        {"rank": 0, "world_size": 0},
    ],
)
def test_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="need"):
        BlockShuffleSampler(_dataset([(1, 1)], 10), **kwargs)


def test_rank_and_world_default_to_single_process() -> None:
    assert distributed_rank_and_world(None, None) == (0, 1)
    assert distributed_rank_and_world(3, 4) == (3, 4)
