"""``pickleshard.Loader``: its batches equal ``DataLoader`` + ``default_collate``'s in the
sampler's order, over every dataset the package opens; resume is exact-once; the bounds hold."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, default_collate

from pickleshard import Loader, MixedDataset, MixSampler, PickleDataset, ShuffleSampler
from pickleshard.formats import open_dataset
from pickleshard.loading import EpochStats, advice, stats_table
from pickleshard.loading.making import tensor_bytes
from pickleshard.pipelines.convert import convert
from pickleshard.testing import assert_same
from pickleshard.testing.resume import check_loader_resume, loader_ids, write_id_files

SIZES = [13, 20, 7, 9]  # 49 samples


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ids") / "data"
    write_id_files(folder, SIZES, dim=6)
    return folder


@pytest.fixture(scope="module")
def ds(data: Path) -> PickleDataset:
    return PickleDataset(data)


def _oracle(dataset: Any, sampler: Iterable[int], batch_size: int, drop_last: bool) -> list[Any]:
    """``default_collate([ds[i] ...])`` in the sampler's order, batch by batch."""
    order = list(sampler)
    cut = len(order) - len(order) % batch_size if drop_last else len(order)
    return [
        default_collate([dataset[i] for i in order[a : min(a + batch_size, cut)]])
        for a in range(0, cut, batch_size)
    ]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch_size=st.integers(1, 20),
    prefetch=st.integers(1, 6),
    threads=st.integers(0, 4),
    drop_last=st.booleans(),
    seed=st.integers(0, 5),
    epoch=st.integers(0, 3),
)
def test_batches_equal_default_collate_in_sampler_order(
    ds: PickleDataset,
    batch_size: int,
    prefetch: int,
    threads: int,
    drop_last: bool,
    seed: int,
    epoch: int,
) -> None:
    sampler = ShuffleSampler(ds, seed=seed)
    loader = Loader(
        ds,
        batch_size,
        sampler=sampler,
        prefetch=prefetch,
        threads=threads,
        drop_last=drop_last,
    )
    loader.set_epoch(epoch)
    got = list(loader)
    reference = ShuffleSampler(ds, seed=seed)
    reference.set_epoch(epoch)
    want = _oracle(ds, reference, batch_size, drop_last)
    assert len(got) == len(want) == len(loader)
    assert_same(got, want)
    stats = loader.stats
    assert stats.batches == len(want)
    assert stats.samples == sum(len(b[1]) for b in want)
    assert stats.max_in_flight <= prefetch


def test_equal_to_dataloader_with_pickleshard_collate(ds: PickleDataset) -> None:
    import pickleshard

    sampler = ShuffleSampler(ds, seed=3)
    want = list(DataLoader(ds, batch_size=8, sampler=sampler, collate_fn=pickleshard.collate))
    got = list(Loader(ds, 8, sampler=ShuffleSampler(ds, seed=3)))
    assert_same(got, want)


def test_default_sampler_is_the_exact_shuffle(ds: PickleDataset) -> None:
    got = loader_ids(Loader(ds, 5, seed=2))
    assert got == list(ShuffleSampler(ds, seed=2))
    assert sorted(got) == list(range(len(ds)))


@pytest.mark.parametrize("threads", [0, 3])
def test_resume_is_exact_once(ds: PickleDataset, threads: int) -> None:
    def make() -> Loader:
        return Loader(ds, 4, sampler=ShuffleSampler(ds, seed=1), prefetch=5, threads=threads)

    check_loader_resume(make, stops=[0, 1, 3, 12, 13, 14, 20, 26])


def test_resume_state_counts_batches_handed_out_not_read_ahead(ds: PickleDataset) -> None:
    loader = Loader(ds, 4, sampler=ShuffleSampler(ds, seed=1), prefetch=8, threads=2)
    it = iter(loader)
    next(it)
    next(it)
    assert loader.state_dict()["sampler"]["samples_seen"] == 8
    assert loader.state_dict()["batches"] == 2
    assert loader.stats.max_in_flight > 1, "reads were in flight ahead of the loop"


def test_resume_with_a_sampler_without_state(ds: PickleDataset) -> None:
    order = np.random.default_rng(0).permutation(len(ds)).tolist()
    straight = loader_ids(Loader(ds, 6, sampler=order))
    first = Loader(ds, 6, sampler=order)
    it = iter(first)
    head = loader_ids([next(it) for _ in range(3)])
    state = first.state_dict()
    assert state == {"sampler": None, "batches": 3, "finished": False}
    second = Loader(ds, 6, sampler=order)
    second.load_state_dict(state)
    assert head + loader_ids(second) == straight
    assert loader_ids(second) == straight, "the pass after a resumed one is whole"


def test_load_state_dict_refuses_another_kind_of_state(ds: PickleDataset) -> None:
    loader = Loader(ds, 4)
    with pytest.raises(ValueError, match="not a Loader state"):
        loader.load_state_dict({"seed": 0, "epoch": 0, "samples_seen": 0})
    with pytest.raises(ValueError, match="ShuffleSampler"):
        loader.load_state_dict({"sampler": {"x": 1}, "batches": 0, "finished": False})


def test_ddp_ranks_split_the_epoch_through_the_sampler(ds: PickleDataset) -> None:
    seen: list[int] = []
    for rank in range(2):
        sampler = ShuffleSampler(ds, seed=4, rank=rank, world_size=2)
        ids = loader_ids(Loader(ds, 5, sampler=sampler))
        assert ids == list(ShuffleSampler(ds, seed=4, rank=rank, world_size=2))
        seen += ids
    assert sorted(set(seen)) == list(range(len(ds)))
    assert len(seen) - len(ds) <= 1, "only the padding repeats"


def _scale(sample: tuple[Any, int]) -> tuple[Any, int]:
    x, y = sample
    return x * 2 + 1, y


@pytest.mark.parametrize("workers", [0, 2])
def test_transform_runs_per_sample_in_threads_or_workers(ds: PickleDataset, workers: int) -> None:
    sampler = ShuffleSampler(ds, seed=5)
    loader = Loader(ds, 7, sampler=sampler, transform=_scale, workers=workers, prefetch=4)
    got = list(loader)
    reference = ShuffleSampler(ds, seed=5)
    want = [default_collate([_scale(s) for s in batch]) for batch in _samples(ds, reference, 7)]
    assert_same(got, want)
    assert loader.stats.batches == len(want)
    assert loader.stats.workers == workers
    assert loader.stats.transform_s > 0


def _samples(ds: Any, sampler: Iterable[int], batch_size: int) -> list[list[Any]]:
    order = list(sampler)
    return [[ds[i] for i in order[a : a + batch_size]] for a in range(0, len(order), batch_size)]


def test_workers_resume_exact_once(ds: PickleDataset) -> None:
    def make() -> Loader:
        return Loader(ds, 6, sampler=ShuffleSampler(ds, seed=2), workers=2, prefetch=4)

    check_loader_resume(make, stops=[2, 9])


def test_converted_and_mixed_datasets(ds: PickleDataset, data: Path, tmp_path: Path) -> None:
    convert(data, tmp_path / "mm", to="memmap")
    memmap = open_dataset(tmp_path / "mm")
    sampler = ShuffleSampler(memmap, seed=0)
    assert_same(list(Loader(memmap, 8, sampler=sampler)), _oracle(memmap, sampler, 8, False))

    mix = MixedDataset([ds, memmap], weights=[0.5, 0.5], seed=1)
    loader = Loader(mix, 8)  # the default sampler of a mix is its own order
    assert isinstance(loader.sampler, MixSampler)
    loader.set_epoch(1)
    reference = MixSampler(mix, seed=0)
    reference.set_epoch(1)
    assert_same(list(loader), _oracle(mix, reference, 8, False))


def test_byte_budget_bounds_the_batches_in_flight(ds: PickleDataset) -> None:
    one = ShuffleSampler(ds, seed=0)
    x, y = next(iter(Loader(ds, 8, sampler=one)))
    batch_bytes = x.nbytes + y.nbytes
    loader = Loader(ds, 8, prefetch=6, threads=2, max_bytes_in_flight=2 * batch_bytes)
    list(loader)
    assert loader.stats.max_bytes_held <= 2 * batch_bytes
    assert loader.stats.max_in_flight <= 2
    assert loader.stats.budget_limited > 0
    wide = Loader(ds, 8, prefetch=6, threads=2)
    list(wide)
    assert wide.stats.max_in_flight > 2


class _Failing(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> Any:
        if i == 13:
            raise KeyError("sample 13 is bad")
        return torch.tensor([i])


@pytest.mark.parametrize("threads", [0, 2])
def test_a_read_error_reaches_the_loop_as_it_was_raised(threads: int) -> None:
    loader = Loader(_Failing(), 4, sampler=list(range(20)), prefetch=3, threads=threads)
    it = iter(loader)
    got = [next(it).ravel().tolist() for _ in range(3)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(KeyError, match="sample 13 is bad"):
        next(it)


def test_threads_follow_the_source_kind(ds: PickleDataset) -> None:
    # local files: read in the loop's thread (a hand-off costs more than a page-cache read)
    assert not ds.remote
    loader = Loader(ds, 4, prefetch=3)
    assert loader.threads == 0
    assert len(list(loader)) == len(loader)
    assert loader.stats.max_in_flight == 0
    assert Loader(ds, 4, prefetch=3, threads=2).threads == 2


def test_arguments_are_checked(ds: PickleDataset) -> None:
    with pytest.raises(ValueError, match="batch_size >= 1"):
        Loader(ds, 0)
    with pytest.raises(ValueError, match="threads >= 0"):
        Loader(ds, 4, threads=-1)
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="no accelerator"):
            assert not Loader(ds, 4, pin_memory=True).pin_memory


def test_stats_table_and_advice() -> None:
    stats = EpochStats(depth=8, threads=8, batches=10, samples=640, seconds=1.0)
    stats.wait_s, stats.loop_s, stats.read_s = 0.02, 0.9, 0.3
    assert "keeps up" in advice(stats)
    stats.wait_s, stats.in_flight_sum = 0.8, 80
    assert "raise prefetch" in advice(stats, remote=True)
    assert "convert" in advice(stats, whole_files=2)
    stats.transform_s = 2.0
    assert "workers=N" in advice(stats)
    table = "\n".join(stats_table(stats))
    assert "waiting for a batch" in table
    assert "640 samples" in table
    assert stats.as_json()["samples_per_s"] == 640.0


def test_profile_command_prints_the_table_and_advice(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from pickleshard.cli import main

    assert main(["profile", str(data), "--batches", "5", "--batch-size", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batches"] == 5
    assert out["samples"] == 20
    assert out["advice"]
    assert out["remote"] is False
    assert main(["profile", str(data), "--batches", "3", "--batch-size", "4"]) == 0
    text = capsys.readouterr().out
    assert "waiting for a batch" in text
    assert "most likely to help:" in text


@pytest.mark.parametrize(("threads", "workers"), [(0, 0), (2, 0), (0, 1)])
def test_pass_clock_counts_the_loop_and_the_pass(
    ds: PickleDataset, threads: int, workers: int
) -> None:
    """Each pass counts the time between batches as the loop's, the whole pass as its wall time,
    and this process's CPU time only where it reads (threads), not with worker processes."""
    loader = Loader(ds, 10, threads=threads, workers=workers)
    t0 = time.perf_counter()
    batches = 0
    for _ in loader:
        batches += 1
        time.sleep(0.02)  # the training loop's step
    wall = time.perf_counter() - t0
    stats = loader.stats
    assert stats.batches == batches == len(loader)
    assert stats.loop_s >= 0.02 * (batches - 1), stats  # the last step is after the last batch
    assert stats.loop_s + stats.wait_s <= stats.seconds <= wall, stats
    assert (stats.cpu_s > 0) is (workers == 0), stats


def test_tensor_bytes_counts_every_tensor_and_array_and_nothing_else() -> None:
    t, a = torch.zeros(3, 5, dtype=torch.float64), np.zeros((2, 7), np.int16)
    batch = [
        (t, {"ids": [1, 2, 3], "name": "x", "score": 1.5, "arr": a}),
        (None, b"raw", True, 3j, [[t], ("s", [a, 4])]),
        {"scalar": np.float32(1.0), "empty": [], "nested": {"deep": (t,)}},
    ]
    assert tensor_bytes(batch) == 3 * t.nbytes + 2 * a.nbytes + 4
    assert tensor_bytes([{"tokens": list(range(100)), "text": "abc"}] * 10) == 0
    assert tensor_bytes(t) == t.nbytes
