"""Mid-epoch resume through torchdata's StatefulDataLoader, in process and after a SIGKILL.

Both samplers and PickleDataset go into ``StatefulDataLoader`` unchanged. The data's ``y`` is each
sample's global index, so the ids a run sees are the samples it trained on.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchdata.stateful_dataloader import StatefulDataLoader

from pickleshard.dataset import PickleDataset
from pickleshard.samplers import BlockShuffleSampler, ShuffleSampler, sampler_state_from_loader
from pickleshard.testing.resume import (
    check_loader_resume,
    check_rescaled_resume,
    check_resume,
    loader_ids,
    write_id_files,
)

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

SCRIPT = Path(__file__).parent / "scripts" / "train_resume.py"
SIZES = [7, 12, 1, 9, 11]  # uneven files: windows and batches straddle file ends
CACHE = 1 << 16  # a few files' worth: BlockShuffleSampler makes several windows


@pytest.fixture(scope="module")
def id_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ids")
    write_id_files(folder, SIZES)
    return folder


def _dataset(folder: Path) -> PickleDataset:
    return PickleDataset(folder, cache_bytes=CACHE)


def _sampler(kind: str, ds: PickleDataset, batch_size: int, workers: int, **kw: Any) -> Any:
    if kind == "shuffle":
        return ShuffleSampler(ds, seed=4, **kw)
    return BlockShuffleSampler(ds, batch_size=batch_size, num_workers=workers, seed=4, **kw)


def test_ids_are_dataset_indices(id_data: Path) -> None:
    ds = _dataset(id_data)
    assert len(ds) == sum(SIZES)
    assert [int(ds[i][1]) for i in range(len(ds))] == list(range(len(ds)))


@pytest.mark.parametrize(
    "config",
    [
        {"batch_size": 4, "num_workers": 2},
        {"batch_size": 3, "num_workers": 0, "world_size": 2, "rank": 1},
        {"batch_size": 5, "num_workers": 1, "world_size": 3, "rank": 0, "drop_last": True},
    ],
)
def test_block_shuffle_sampler_passes_the_resume_checker(
    id_data: Path, config: dict[str, int]
) -> None:
    ds = _dataset(id_data)
    check_resume(lambda: BlockShuffleSampler(ds, seed=9, **config), stops=[0, 1, 5, 17, 39, 99])


@pytest.mark.parametrize("kind", ["shuffle", "block"])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(
    ("before", "after"),
    [((1, 0), (1, 0)), ((2, 2), (2, 2)), ((2, 0), (3, 2)), ((3, 1), (1, 0)), ((1, 2), (1, 0))],
)
def test_every_sampler_passes_the_rescaled_resume_checker(
    id_data: Path,
    kind: str,
    drop_last: bool,
    before: tuple[int, int],
    after: tuple[int, int],
) -> None:
    ds = _dataset(id_data)

    def make(rank: int, world: int, workers: int) -> Any:
        return _sampler(kind, ds, 3, workers, rank=rank, world_size=world, drop_last=drop_last)

    check_rescaled_resume(
        make,
        len(ds),
        before=before,
        after=after,
        stops=[0, 1, 4, 7, 40],
        rescales=kind == "shuffle",
        epoch=1,
    )


def test_block_shuffle_sampler_refuses_other_settings(id_data: Path) -> None:
    ds = _dataset(id_data)
    state = BlockShuffleSampler(ds, batch_size=4, num_workers=2).state_dict()
    with pytest.raises(ValueError, match="cannot resume"):
        BlockShuffleSampler(ds, batch_size=4, num_workers=3).load_state_dict(state)
    with pytest.raises(ValueError, match="not a BlockShuffleSampler state"):
        BlockShuffleSampler(ds).load_state_dict({"seed": 0, "epoch": 0, "samples_seen": 0})


@pytest.mark.parametrize("kind", ["shuffle", "block"])
@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_mid_epoch_and_across_the_boundary(
    id_data: Path, kind: str, workers: int
) -> None:
    ds = _dataset(id_data)

    def make() -> StatefulDataLoader:
        sampler = _sampler(kind, ds, 4, workers)
        return StatefulDataLoader(ds, batch_size=4, sampler=sampler, num_workers=workers)

    per_epoch = math.ceil(len(ds) / 4)
    # Mid first epoch, its very end (state taken before StopIteration), mid second epoch.
    check_loader_resume(make, stops=[3, per_epoch, per_epoch + 2])


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    batch_size=st.integers(1, 4),
    worlds=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    workers=st.tuples(st.sampled_from([0, 2]), st.sampled_from([0, 1, 2])),
    steps=st.integers(0, 12),
)
def test_shuffle_resumes_on_another_world_size_and_worker_count(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    batch_size: int,
    worlds: tuple[int, int],
    workers: tuple[int, int],
    steps: int,
) -> None:
    """``W`` ranks of StatefulDataLoaders each take ``steps`` batches; rank 0's loader state,
    through :func:`sampler_state_from_loader`, resumes the epoch on ``W'`` ranks with another
    number of workers. Together they see every sample, each once, but for DistributedSampler's
    padding (here only at the very end of each part, since batches are whole)."""
    folder = tmp_path_factory.mktemp("prop")
    n = write_id_files(folder, sizes)
    ds = _dataset(folder)

    def loader(rank: int, world: int, num_workers: int) -> StatefulDataLoader:
        sampler = ShuffleSampler(ds, seed=2, rank=rank, world_size=world)
        sampler.set_epoch(1)
        return StatefulDataLoader(
            ds, batch_size=batch_size, sampler=sampler, num_workers=num_workers
        )

    before, after = worlds
    seen: list[int] = []
    states = []
    for rank in range(before):
        first = loader(rank, before, workers[0])
        it = iter(first)
        for batch in (next(it, None) for _ in range(steps)):
            seen += [] if batch is None else loader_ids([batch])
        states.append(sampler_state_from_loader(first.state_dict()))
        del it, first
    assert all(s == states[0] for s in states)

    for rank in range(after):
        resumed = loader(rank, after, workers[1])
        resumed.sampler.load_state_dict(states[0])
        seen += loader_ids(resumed)

    counts = Counter(seen)
    assert set(counts) == set(range(n)), "every sample seen"
    position = states[0]["samples_seen"]
    taken_positions = before * min(steps * batch_size, math.ceil(n / before))
    padding = (taken_positions - position) + (-(n - position) % after)
    assert sum(c - 1 for c in counts.values()) == padding, "repeats are padding only"


def _run_until_done(args: list[str], kills: int, log: Path) -> None:
    for life in range(kills + 1):
        # To a file, not a pipe: the killed run's orphaned workers would hold a pipe open until
        # they notice their parent is gone (up to 5 s).
        with open(log, "w") as out:
            proc = subprocess.run(
                [sys.executable, str(SCRIPT), *args], stdout=out, stderr=out, timeout=120
            )
        expected = -signal.SIGKILL if life < kills else 0
        assert proc.returncode == expected, f"life {life}: rc={proc.returncode}\n{log.read_text()}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "workers", "kill_at"),
    [
        # 40 samples in batches of 4: 10 steps an epoch, 2 epochs.
        ("shuffle", 2, [3, 10, 14]),  # mid epoch 0, at its last batch, mid epoch 1
        ("block", 2, [6, 13]),
        ("shuffle", 0, [17]),
    ],
)
def test_sigkill_and_restart_sees_each_sample_once_per_epoch(
    id_data: Path, tmp_path: Path, kind: str, workers: int, kill_at: list[int]
) -> None:
    state, seen = tmp_path / "ckpt.pt", tmp_path / "seen.txt"
    _run_until_done(
        [
            *("--data", str(id_data), "--sampler", kind, "--workers", str(workers), "--seed", "4"),
            *("--batch-size", "4", "--epochs", "2", "--kill-at", ",".join(map(str, kill_at))),
            *("--state", str(state), "--seen", str(seen)),
        ],
        kills=len(kill_at),
        log=tmp_path / "log.txt",
    )
    by_epoch: dict[int, list[int]] = {0: [], 1: []}
    for line in seen.read_text().splitlines():
        epoch, *ids = map(int, line.split())
        by_epoch[epoch] += ids

    ds = _dataset(id_data)
    for epoch, ids in by_epoch.items():
        assert sorted(ids) == list(range(len(ds))), f"epoch {epoch}: each sample exactly once"
        # And in the very order an uninterrupted run would have used.
        sampler = _sampler(kind, ds, 4, workers)
        sampler.set_epoch(epoch)
        assert ids == list(sampler)
