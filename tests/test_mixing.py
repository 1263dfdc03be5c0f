"""MixedDataset and MixSampler: exact counts per epoch, draws without replacement per source, the
exhaustion policies, field checks, tags, batch reads, and exact-once resume over ranks and workers.

The data: each source is a folder of ``pickle.dump((x_list, y_list))`` files whose ``y`` is a
sample id unique across all sources (``1000 * source + index``) and ``x`` an array equal to it, so
an id says which sample of which source was read. The oracle is ``pickle.load`` of those files and
the mix's stated order (:meth:`MixedDataset.locate`).
"""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import pickleshard
from mixsources import oracle, write_source
from pickleshard import PickleDataset, PickleshardError
from pickleshard.mixing import (
    MixedDataset,
    MixedFieldsError,
    MixSampler,
    SourceExhaustedError,
    apportion,
)
from pickleshard.samplers import sampler_state_from_loader
from pickleshard.testing.resume import (
    check_loader_resume,
    check_rescaled_resume,
    check_resume,
    loader_ids,
)

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

SIZES = (60, 35, 25)  # source 0 runs out within epoch 1 at 50 draws an epoch
WEIGHTS = (0.5, 0.3, 0.2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("mix")
    out = []
    for s, n in enumerate(SIZES):
        write_source(root / f"s{s}", s, n)
        out.append(root / f"s{s}")
    return out


@pytest.fixture(scope="module")
def sources(folders: list[Path]) -> list[PickleDataset]:
    return [PickleDataset(f) for f in folders]


def ids_of(mix: MixedDataset, indices: Sequence[int]) -> list[int]:
    return [int(s[1]) for s in mix.__getitems__(list(indices))]


# Counts and draws.


def test_apportion_is_the_largest_remainder_split() -> None:
    assert apportion([0.5, 0.3, 0.2], 100) == [50, 30, 20]
    assert apportion([0.5, 0.3, 0.2], 97) == [49, 29, 19]  # quotas 48.5, 29.1, 19.4
    assert apportion([1, 1, 1], 10) == [4, 3, 3]  # equal remainders: the lower source first
    assert apportion([2, 0, 1], 7) == [5, 0, 2]
    with pytest.raises(ValueError, match="positive sum"):
        apportion([0, 0], 5)


def test_counts_from_proportions_absolute_counts_and_sizes(sources: list[PickleDataset]) -> None:
    assert MixedDataset(sources, WEIGHTS, epoch_size=100).counts == [50, 30, 20]
    absolute = MixedDataset(sources, [7, 5, 3])
    assert (absolute.counts, len(absolute)) == ([7, 5, 3], 15)
    assert MixedDataset(sources, np.array([7, 5, 3])).counts == [7, 5, 3]
    assert MixedDataset(sources).counts == list(SIZES)  # default: one pass over each
    assert MixedDataset(sources, [2, 1, 1], epoch_size=8).counts == [4, 2, 2]  # ints as weights


@pytest.mark.parametrize("epoch_size", [100, 97])
def test_twenty_epochs_draw_exactly_the_stated_counts(
    sources: list[PickleDataset], epoch_size: int
) -> None:
    mix = MixedDataset(sources, WEIGHTS, epoch_size=epoch_size, seed=5)
    expected = apportion(WEIGHTS, epoch_size)
    orders = []
    for epoch in range(20):
        mix.set_epoch(epoch)
        src, _ = mix.locate(np.arange(epoch_size))
        assert np.bincount(src, minlength=3).tolist() == expected, f"epoch {epoch}"
        orders.append(src.tolist())
    assert len({tuple(o) for o in orders}) == 20, "each epoch its own interleave"


@pytest.mark.parametrize("policy", ["repeat", "resample", "stop"])
def test_no_sample_repeats_within_its_source_before_the_source_is_exhausted(
    sources: list[PickleDataset], policy: str
) -> None:
    counts = [50, 30, 20] if policy != "stop" else [20, 10, 5]
    mix = MixedDataset(sources, counts, policy=policy, seed=2)  # type: ignore[arg-type]
    epochs = 20 if policy != "stop" else 3  # stop: 60 // 20 epochs of source 0
    per_source: list[list[int]] = [[] for _ in SIZES]
    for epoch in range(epochs):
        mix.set_epoch(epoch)
        for sample in mix.__getitems__(list(range(len(mix)))):
            per_source[int(sample[1]) // 1000].append(int(sample[1]) % 1000)
    for s, seen in enumerate(per_source):
        n = SIZES[s]
        assert set(seen) <= set(range(n))
        first_pass = min(len(seen), counts[s] * (n // counts[s]))  # draws before it runs out
        assert len(set(seen[:first_pass])) == first_pass, f"source {s} repeated early"
        tally = Counter(seen)
        if policy == "repeat":  # every pass is a full one: counts differ by at most one
            assert max(tally.values()) - min(tally[k] for k in range(n)) <= 1
        if policy == "stop":
            assert len(seen) == len(set(seen)), "stop never repeats"


def test_policies_differ_after_exhaustion_and_stop_raises(sources: list[PickleDataset]) -> None:
    stop = MixedDataset(sources, [20, 10, 5], policy="stop")
    stop.set_epoch(2)
    with pytest.raises(SourceExhaustedError, match=r"source 0 \(60 samples, 20 drawn per epoch\)"):
        stop.set_epoch(3)
    with pytest.raises(PickleshardError, match="fills epochs 0 to 2"):
        stop.resolve(4, [0])
    with pytest.raises(SourceExhaustedError, match="fills epochs 0 to 2"):
        MixSampler(stop).set_epoch(3)
    with pytest.raises(SourceExhaustedError, match="cannot fill one epoch"):
        MixedDataset(sources, [61, 1, 1], policy="stop")
    repeat = MixedDataset(sources, [120, 0, 0], policy="repeat", seed=1)
    resample = MixedDataset(sources, [120, 0, 0], policy="resample", seed=1)
    rep, res = ids_of(repeat, range(120)), ids_of(resample, range(120))
    assert Counter(rep) == Counter(dict.fromkeys(range(60), 2)), "repeat: two full passes"
    # resample: a full first pass, then 60 draws with replacement (seeded: never all distinct)
    assert set(res) == set(range(60))
    assert any(c != 2 for c in Counter(res).values())


def test_an_epoch_is_deterministic_for_a_seed_and_epoch(sources: list[PickleDataset]) -> None:
    a = MixedDataset(sources, WEIGHTS, epoch_size=100, seed=7)
    b = MixedDataset(sources, WEIGHTS, epoch_size=100, seed=7)
    c = MixedDataset(sources, WEIGHTS, epoch_size=100, seed=8)
    for mix in (a, b, c):
        mix.set_epoch(3)
    assert ids_of(a, range(100)) == ids_of(b, range(100)) != ids_of(c, range(100))
    assert ids_of(a, a.resolve(3, range(100))) == ids_of(a, range(100)), "resolved"


# Fields, transforms, tags, batches.


def test_different_fields_raise_naming_them_unless_transformed(tmp_path: Path) -> None:
    write_source(tmp_path / "a", 0, 10)
    with open(tmp_path / "b.pkl", "wb") as fh:
        labels = list(range(1000, 1010))
        pickle.dump({"image": [np.zeros(2, np.float32)] * 10, "label": labels}, fh)
    a, b = PickleDataset(tmp_path / "a"), PickleDataset([tmp_path / "b.pkl"])
    with pytest.raises(
        MixedFieldsError, match=r"source 0: \('x', 'y'\); source 1: \('image',"
    ) as e:
        MixedDataset([a, b])
    assert isinstance(e.value, PickleshardError)
    assert isinstance(e.value, ValueError)
    mix = MixedDataset([a, b], transforms=[None, lambda s: (s["image"] + 1, s["label"])], tag=True)
    assert mix.fields == ("x", "y", "source")
    got = {int(s[1]): (s[0].tolist(), s[2]) for s in mix.__getitems__(list(range(20)))}
    assert got[1003] == ([1.0, 1.0], 1)
    assert got[3] == ([3.0, 3.0], 0)


def test_tags_name_the_source_of_each_sample(sources: list[PickleDataset]) -> None:
    mix = MixedDataset(sources, WEIGHTS, epoch_size=100, tag=True, seed=3)
    for x, y, source in mix.__getitems__(list(range(100))):
        assert source == int(y) // 1000
        assert float(x[0]) == y


def test_getitems_equals_getitem_and_reads_each_source_once(
    sources: list[PickleDataset],
) -> None:
    calls: list[int] = []

    class Spy:
        def __init__(self, ds: PickleDataset, s: int) -> None:
            self.ds, self.s, self.fields = ds, s, ds.fields

        def __len__(self) -> int:
            return len(self.ds)

        def __getitem__(self, i: int) -> Any:
            return self.ds[i]

        def __getitems__(self, idx: list[int]) -> list[Any]:
            calls.append(self.s)
            return self.ds.__getitems__(idx)

    mix = MixedDataset([Spy(d, s) for s, d in enumerate(sources)], WEIGHTS, epoch_size=100)
    mix.set_epoch(1)
    batch = [5, 99, 0, 42, 7, 63, 100 + 61, 18]  # 161: resolved, sample 1 of source 1
    got = mix.__getitems__(batch)
    assert calls == [0, 1, 2], "one call per source"
    one_by_one = [mix[i] for i in batch]
    for g, o in zip(got, one_by_one, strict=True):
        assert int(g[1]) == int(o[1])
        assert np.array_equal(g[0], o[0])
    assert int(mix[-1][1]) == int(mix[99][1])
    with pytest.raises(IndexError, match="sample index -101 out of range"):
        mix[-101]


def test_mixes_a_pickle_dataset_with_a_converted_one(tmp_path: Path) -> None:
    write_source(tmp_path / "a", 0, 12)
    write_source(tmp_path / "b", 1, 8)
    pickleshard.convert(tmp_path / "b", tmp_path / "b.mm", to="memmap")
    converted = pickleshard.open_dataset(tmp_path / "b.mm")
    mix = MixedDataset([PickleDataset(tmp_path / "a"), converted], [0.6, 0.4], epoch_size=20)
    got = sorted(int(s[1]) for s in mix.__getitems__(list(range(20))))
    assert got == list(range(12)) + list(range(1000, 1008))


# DataLoader, sampler and resume.


def test_dataloader_epochs_with_two_persistent_workers_equal_the_oracle(
    folders: list[Path],
) -> None:
    """Persistent workers keep the copy of the mix they started with: each epoch is still the
    stated one (the mix's positions in order, of the epoch set), since MixSampler's indices are
    resolved for the epoch of its pass."""
    mix = MixedDataset(
        [PickleDataset(f) for f in folders], WEIGHTS, epoch_size=100, tag=True, seed=11
    )
    sampler = MixSampler(mix, seed=4)
    loader = DataLoader(mix, batch_size=8, sampler=sampler, num_workers=2, persistent_workers=True)
    truth = [oracle(f) for f in folders]
    for epoch in range(3):
        sampler.set_epoch(epoch)
        got = [
            (x.tolist(), int(y), int(s))
            for xb, yb, sb in loader
            for x, y, s in zip(xb, yb, sb, strict=True)
        ]
        src, smp = mix.locate(range(len(mix)))  # the epoch's positions in the mix's order
        expected = []
        for s, k in zip(src.tolist(), smp.tolist(), strict=True):
            x, y = truth[s][k]
            expected.append((x.tolist(), y, s))
        assert got == expected, f"epoch {epoch}"


def _as_samples(sampler: MixSampler) -> Any:
    """A view of ``sampler`` yielding each resolved index's place among the sources' samples,
    for the rescaled checker, which counts ``[0, n)``: with one pass over each source an epoch
    (the default weights), an epoch holds each sample once."""
    n = len(sampler.mix)

    class View:
        def __iter__(self) -> Any:
            return (i - n for i in sampler)

        def __getattr__(self, name: str) -> Any:
            return getattr(sampler, name)

    return View()


@settings(max_examples=20, deadline=None)
@given(
    epoch=st.integers(0, 3),
    stops=st.lists(st.integers(0, 110), min_size=1, max_size=4),
    world=st.integers(1, 3),
    weights=st.lists(st.integers(1, 9), min_size=3, max_size=3),
    shuffle=st.booleans(),
)
def test_mix_sampler_passes_the_resume_checker(
    epoch: int, stops: list[int], world: int, weights: list[int], shuffle: bool
) -> None:
    def make_mix() -> MixedDataset:
        return MixedDataset([list(range(n)) for n in SIZES], weights, epoch_size=100, seed=3)

    check_resume(
        lambda: MixSampler(make_mix(), seed=9, rank=world - 1, world_size=world, shuffle=shuffle),
        stops,
        epoch,
    )

    def make(rank: int, world_size: int, workers: int) -> Any:
        mix = MixedDataset([list(range(n)) for n in SIZES], seed=3)  # one pass over each
        return _as_samples(
            MixSampler(mix, seed=9, rank=rank, world_size=world_size, shuffle=shuffle)
        )

    check_rescaled_resume(
        make,
        sum(SIZES),
        before=(world, 0),
        after=(4 - world, 0),
        stops=stops,
        rescales=True,
        epoch=epoch,
    )


@pytest.fixture(scope="module")
def even_folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Sources of 40, 24, 16 drawn 20, 12, 8 an epoch: half a pass each, so an id is unique
    within an epoch and a delivered epoch can be counted by ids."""
    root = tmp_path_factory.mktemp("even")
    for s, n in enumerate((40, 24, 16)):
        write_source(root / f"s{s}", s, n, files=2)
    return [root / f"s{s}" for s in range(3)]


def _even_mix(folders: list[Path]) -> MixedDataset:
    return MixedDataset([PickleDataset(f) for f in folders], WEIGHTS, epoch_size=40, seed=6)


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_the_mix_across_epochs(
    even_folders: list[Path], workers: int
) -> None:
    mix = _even_mix(even_folders)

    def make() -> StatefulDataLoader:
        sampler = MixSampler(mix, seed=1)
        return StatefulDataLoader(mix, batch_size=4, sampler=sampler, num_workers=workers)

    check_loader_resume(make, stops=[3, 10, 13])


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    epoch=st.integers(0, 3),
    batch_size=st.integers(1, 5),
    worlds=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    workers=st.tuples(st.sampled_from([0, 1, 2]), st.sampled_from([0, 1, 2])),
    steps=st.integers(0, 12),
    shuffle=st.booleans(),
)
def test_a_mixed_epoch_resumes_on_other_ranks_and_workers(
    even_folders: list[Path],
    epoch: int,
    batch_size: int,
    worlds: tuple[int, int],
    workers: tuple[int, int],
    steps: int,
    shuffle: bool,
) -> None:
    """``W`` ranks take ``steps`` batches of epoch ``epoch``; the state resumes it on ``W'`` ranks
    with other worker counts. Same world: each rank's sequence is its uninterrupted one. Any
    world: together they deliver the epoch's mix, each sample once but for padding."""
    mix = _even_mix(even_folders)
    n = len(mix)

    def loader(rank: int, world: int, num_workers: int) -> StatefulDataLoader:
        sampler = MixSampler(mix, seed=2, rank=rank, world_size=world, shuffle=shuffle)
        sampler.set_epoch(epoch)
        return StatefulDataLoader(
            mix, batch_size=batch_size, sampler=sampler, num_workers=num_workers
        )

    before, after = worlds
    heads: list[list[int]] = []
    states = []
    for rank in range(before):
        first = loader(rank, before, workers[0])
        it = iter(first)
        heads.append(loader_ids(b for b in (next(it, None) for _ in range(steps)) if b is not None))
        states.append(sampler_state_from_loader(first.state_dict()))
        del it, first
    assert all(s == states[0] for s in states)
    tails = []
    for rank in range(after):
        resumed = loader(rank, after, workers[1])
        resumed.sampler.set_epoch((epoch + 1) % 4)  # the loaded state's epoch wins
        resumed.sampler.load_state_dict(states[0])
        tails.append(loader_ids(resumed))
    if before == after:
        for rank in range(before):
            straight = loader_ids(loader(rank, before, 0))
            assert heads[rank] + tails[rank] == straight, f"rank {rank} resumed"
    mix.set_epoch(epoch)
    stated = Counter(int(s[1]) for s in mix.__getitems__(list(range(n))))
    seen = Counter(i for part in heads + tails for i in part)
    assert set(seen) == set(stated), "every sample of the epoch's mix delivered"
    position = states[0]["samples_seen"]
    taken = before * min(steps * batch_size, math.ceil(n / before))
    padding = (taken - position) + (-(n - position) % after)
    assert sum(seen.values()) - n == padding, "repeats are padding only"


def test_exported_lazily_from_the_top_level() -> None:
    assert pickleshard.MixedDataset is MixedDataset
    assert pickleshard.MixSampler is MixSampler


def test_plain_indices_follow_set_epoch_and_resolved_ones_name_their_sample(
    sources: list[PickleDataset],
) -> None:
    mix = MixedDataset(sources, WEIGHTS, epoch_size=100, seed=1)
    mix.set_epoch(2)
    epoch2 = ids_of(mix, range(100))
    resolved = mix.resolve(2, range(100))
    mix.set_epoch(0)
    assert ids_of(mix, resolved) == epoch2
    assert ids_of(mix, range(100)) != epoch2
    assert ids_of(mix, [100, 100 + 60, 100 + 95, 100 + 119]) == [0, 1000, 2000, 2024]
    with pytest.raises(IndexError, match="out of range"):
        mix[100 + 120]


def test_a_mix_pickles_with_its_state_and_reads_the_same(sources: list[PickleDataset]) -> None:
    mix = MixedDataset(sources, WEIGHTS, epoch_size=100, seed=4, tag=True)
    mix.set_epoch(3)
    mix.locate(range(100))  # fills the Feistel cache, which does not travel
    copy = pickle.loads(pickle.dumps(mix))
    assert copy.epoch == 3
    assert ids_of(copy, range(100)) == ids_of(mix, range(100))


def test_bad_arguments_say_what_was_expected(sources: list[PickleDataset]) -> None:
    with pytest.raises(ValueError, match="at least one dataset"):
        MixedDataset([])
    with pytest.raises(ValueError, match="3 datasets but 2 weights"):
        MixedDataset(sources, [0.5, 0.5])
    with pytest.raises(ValueError, match="positive sum"):
        MixedDataset(sources, [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="policy must be one of stop, repeat, resample"):
        MixedDataset(sources, policy="cycle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="3 datasets but 1 transforms"):
        MixedDataset(sources, transforms=[None])
    with pytest.raises(ValueError, match="source 1 is empty"):
        MixedDataset([[1, 2], []], [1, 1])


def test_untupled_samples_are_tagged_as_pairs() -> None:
    mix = MixedDataset([["a", "b"], ["c"]], tag=True)
    assert sorted(mix.__getitems__([0, 1, 2])) == [("a", 0), ("b", 0), ("c", 1)]
    assert mix.fields is None  # lists have no fields


@pytest.mark.slow
def test_the_mix_benchmark_runs_and_reports_a_ratio(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "bench", "mix", "--quick", "--workers", "0", "--rounds", "1"]
    cmd += ["--data", str(tmp_path / "data"), "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "mix-quick.md").read_text()
    assert "| 0 |" in report
    assert "Target mix / one >= 0.95x" in report
