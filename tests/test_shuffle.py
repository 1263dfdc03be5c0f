"""ShuffleSampler: a bijection per (seed, epoch), DistributedSampler's split, resume across world sizes."""

from __future__ import annotations

import math
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

import pickleshard.samplers.shuffle as shuffle_module
from pickleshard.samplers.shuffle import (
    FeistelPermutation,
    ShuffleSampler,
    sampler_state_from_loader,
)
from pickleshard.testing.resume import check_resume


class Sized:
    """A dataset of ``n`` samples as far as a sampler can tell."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


EDGE_SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 255, 256, 257, 1000, 4095, 4096, 4097]


@pytest.mark.parametrize("n", EDGE_SIZES)
def test_permutation_is_a_bijection(n: int) -> None:
    values = FeistelPermutation(n, seed=7, epoch=3)(np.arange(n))
    assert values.dtype == np.int64
    assert sorted(values.tolist()) == list(range(n))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 70_000),
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 10**6),
)
def test_permutation_is_a_bijection_for_any_key(n: int, seed: int, epoch: int) -> None:
    values = FeistelPermutation(n, seed, epoch)(np.arange(n))
    assert np.array_equal(np.sort(values), np.arange(n))


_MASK64 = (1 << 64) - 1


def _scalar_perm(n: int, seed: int, epoch: int, q: int) -> int:
    """The module docstring's definition in Python ints, one value at a time: six Feistel
    rounds of splitmix64 keyed by SeedSequence([seed, epoch]), cycle walking into [0, n)."""
    half = max(1, math.ceil((n - 1).bit_length() / 2)) if n > 1 else 1
    mask = (1 << half) - 1
    keys = [int(k) for k in np.random.SeedSequence([seed, epoch]).generate_state(6, np.uint64)]

    def mix(z: int) -> int:
        z = (z * 0x9E3779B97F4A7C15) & _MASK64
        z ^= z >> 30
        z = (z * 0xBF58476D1CE4E5B9) & _MASK64
        z ^= z >> 27
        z = (z * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    x = q
    while True:
        left, right = x >> half, x & mask
        for key in keys:
            left, right = right, left ^ (mix(right ^ key) & mask)
        x = (left << half) | right
        if x < n:
            return x


@settings(max_examples=80, deadline=None)
@given(
    n=st.one_of(st.integers(1, 5000), st.integers(1, 2**40)),
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 10**6),
    data=st.data(),
)
def test_compiled_and_numpy_permutations_each_equal_the_definition(
    n: int, seed: int, epoch: int, data: st.DataObject
) -> None:
    q = np.asarray(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40)), np.int64)
    perm = FeistelPermutation(n, seed, epoch)
    want = [_scalar_perm(n, seed, epoch, int(v)) for v in q]
    assert perm.reference(q).tolist() == want
    got = perm(q)  # the compiled core where it is built
    assert got.dtype == np.int64
    assert got.tolist() == want
    assert perm(q.reshape(-1, 1)).shape == (len(q), 1)


def test_compiled_permutation_refuses_positions_outside_its_range() -> None:
    perm = FeistelPermutation(10, 0, 0)
    for bad in ([10], [-1], [3, 11]):
        with pytest.raises(ValueError, match="outside"):
            perm(np.asarray(bad))


def test_permutation_without_the_compiled_core_is_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    perm = FeistelPermutation(1000, 3, 1)
    compiled = perm(np.arange(1000))
    monkeypatch.setattr(shuffle_module, "CORE", None)
    assert np.array_equal(perm(np.arange(1000)), compiled)


def test_permutation_is_keyed_by_seed_and_epoch() -> None:
    base = FeistelPermutation(1000, 0, 0)(np.arange(1000))
    assert np.array_equal(base, FeistelPermutation(1000, 0, 0)(np.arange(1000)))
    for other in (FeistelPermutation(1000, 1, 0), FeistelPermutation(1000, 0, 1)):
        # Unrelated permutations agree on about one position in 1000.
        assert int((other(np.arange(1000)) == base).sum()) < 20


def test_shuffle_looks_uniform() -> None:
    # Where sample 0 lands, over 4000 epochs of a 10-sample dataset: 400 per place expected.
    n, epochs = 10, 4000
    places = Counter(
        int(np.argmax(FeistelPermutation(n, 0, e)(np.arange(n)) == 0)) for e in range(epochs)
    )
    assert set(places) == set(range(n))
    chi2 = sum((c - epochs / n) ** 2 / (epochs / n) for c in places.values())
    assert chi2 < 40, places  # 9 degrees of freedom: p < 1e-5 for chi2 > 40
    # And a big permutation keeps no trace of the identity.
    big = FeistelPermutation(100_000, 0, 0)(np.arange(100_000))
    assert abs(np.corrcoef(np.arange(100_000), big)[0, 1]) < 0.02
    assert int((big == np.arange(100_000)).sum()) < 20


@pytest.mark.parametrize("n", [0, 1, 5, 10, 11, 12, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_split_is_distributed_samplers(n: int, world_size: int, drop_last: bool) -> None:
    ds = Sized(n)
    for rank in range(world_size):
        ours = ShuffleSampler(
            ds, shuffle=False, rank=rank, world_size=world_size, drop_last=drop_last
        )
        torchs = DistributedSampler(
            ds, num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop_last
        )
        assert len(ours) == len(torchs)
        assert list(ours) == list(torchs)


@pytest.mark.parametrize("n", [1, 10, 11, 97])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_cover_the_epoch_once_with_padding(n: int, world_size: int) -> None:
    streams = [
        list(ShuffleSampler(Sized(n), seed=5, rank=r, world_size=world_size))
        for r in range(world_size)
    ]
    assert {len(s) for s in streams} == {math.ceil(n / world_size)}
    seen = Counter(i for s in streams for i in s)
    assert set(seen) == set(range(n))
    assert sum(c - 1 for c in seen.values()) == world_size * math.ceil(n / world_size) - n


@pytest.mark.parametrize(
    "config",
    [
        {"world_size": 1, "rank": 0},
        {"world_size": 3, "rank": 2},
        {"world_size": 4, "rank": 1, "drop_last": True},
        {"world_size": 2, "rank": 0, "shuffle": False},
        {"world_size": 1, "rank": 0, "chunk_size": 3},
    ],
)
def test_resume_checker(config: dict[str, int]) -> None:
    def make() -> ShuffleSampler:
        return ShuffleSampler(Sized(53), seed=11, **config)

    check_resume(make, stops=[0, 1, 2, 7, 13, 17, 100], epoch=2)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    world_before=st.integers(1, 5),
    world_after=st.integers(1, 5),
    drop_last=st.booleans(),
    steps=st.integers(0, 250),
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 5),
)
def test_resume_with_another_world_size_sees_each_sample_once(
    sizes: list[int],
    world_before: int,
    world_after: int,
    drop_last: bool,
    steps: int,
    seed: int,
    epoch: int,
) -> None:
    """Every rank takes ``steps`` samples (DDP keeps ranks in lockstep); rank 0's state resumes
    the epoch on ``world_after`` ranks. Together: each sample once, plus exactly the padding
    ``DistributedSampler`` would add (or minus what ``drop_last`` drops)."""
    n = sum(sizes)  # files x samples per file: the sampler sees only their total
    ds = Sized(n)

    def sampler(rank: int, world: int) -> ShuffleSampler:
        s = ShuffleSampler(ds, seed=seed, rank=rank, world_size=world, drop_last=drop_last)
        s.set_epoch(epoch)
        return s

    before = [sampler(r, world_before) for r in range(world_before)]
    steps = min(steps, len(before[0]))
    taken: list[int] = []
    states = []
    for s in before:
        it = iter(s)
        taken += [next(it) for _ in range(steps)]
        states.append(s.state_dict())
    assert all(state == states[0] for state in states), "ranks in lockstep share one state"
    position = states[0]["samples_seen"]
    assert position == min(n, steps * world_before)

    rest: list[int] = []
    for r in range(world_after):
        s = sampler(r, world_after)
        s.set_epoch(epoch + 1)  # the loaded state's epoch wins for the resumed pass
        s.load_state_dict(states[0])
        rest += list(s)

    seen = Counter(taken + rest)
    left = n - position
    if drop_last:
        assert all(c == 1 for c in seen.values())
        assert len(seen) == n - left % world_after
    else:
        assert set(seen) == set(range(n))
        padding = (steps * world_before - position) + (-left % world_after)
        assert sum(c - 1 for c in seen.values()) == padding


def _peak_bytes_iterating(n: int, count: int) -> int:
    sampler = ShuffleSampler(Sized(n), seed=3)
    tracemalloc.start()
    try:
        it = iter(sampler)
        for _ in range(count):
            next(it)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_n() -> None:
    small, huge = _peak_bytes_iterating(10**5, 20_000), _peak_bytes_iterating(10**12, 20_000)
    # A few 8192-value chunks (int64 arrays and one list of ints): about 1 MB, whatever N is.
    assert huge < 2 << 20
    assert huge < 2 * small


def test_values_of_a_huge_epoch_are_distinct_and_in_range() -> None:
    n = 10**8
    it = iter(ShuffleSampler(Sized(n), seed=1))
    head = [next(it) for _ in range(20_000)]
    assert len(set(head)) == len(head)
    assert min(head) >= 0
    assert max(head) < n


def test_rejects_a_state_that_is_not_its_own() -> None:
    s = ShuffleSampler(Sized(10))
    with pytest.raises(ValueError, match="not a ShuffleSampler state"):
        s.load_state_dict({"seed": 0, "epoch": 0})
    with pytest.raises(ValueError, match="not a ShuffleSampler state"):
        s.load_state_dict({"seed": 0, "epoch": -1, "samples_seen": 0})
    with pytest.raises(ValueError, match="another dataset"):
        s.load_state_dict({"seed": 0, "epoch": 0, "samples_seen": 11})
    with pytest.raises(ValueError, match="rank"):
        ShuffleSampler(Sized(10), rank=2, world_size=2)


def test_state_from_loader_finds_the_one_sampler_state() -> None:
    state = {"seed": 1, "epoch": 2, "samples_seen": 3}
    nested = {"_snapshot": {"_main_snapshot": {"it": {"sampler_state": state}}}}
    assert sampler_state_from_loader({**nested, "_steps_since_snapshot": 0}) == state
    with pytest.raises(ValueError, match="snapshot_every_n_steps=1"):
        sampler_state_from_loader({**nested, "_steps_since_snapshot": 2})
    with pytest.raises(ValueError, match="expected one"):
        sampler_state_from_loader({"a": None})


@given(
    n=st.integers(0, 300),
    world_size=st.integers(1, 3),
    sizes=st.lists(st.integers(0, 70), max_size=8),
    resume_at=st.integers(0, 40),
)
def test_take_gives_what_next_gives_and_the_same_state(
    n: int, world_size: int, sizes: list[int], resume_at: int
) -> None:
    def sampler() -> ShuffleSampler:
        s = ShuffleSampler(Sized(n), seed=3, rank=world_size - 1, world_size=world_size)
        s.load_state_dict({**s.state_dict(), "samples_seen": min(resume_at, n)})
        return s

    by_next, by_take = iter(sampler()), iter(sampler())
    for k in sizes:
        want = [i for _, i in zip(range(k), by_next, strict=False)]
        assert by_take.take(k) == want
        assert by_take.get_state() == by_next.get_state()
    assert by_take.take(10**6) == list(by_next)
    assert by_take.take(5) == []
