"""The index build's executor seam: where the per-file work runs is one small class.

A build hands its executor one function and one argument tuple per file and takes results back
in any order; an index built through any executor equals the default one, bad files come back
as values (``skip_bad``) or stop the build, and the default is chosen from ``jobs``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from conftest import oracle_samples
from pickleshard import errors
from pickleshard.dataset import PickleDataset
from pickleshard.executors import InlineExecutor, ProcessPoolIndexExecutor, local_executor
from pickleshard.index import DatasetIndex
from pickleshard.indexing.build import build_index
from pickleshard.indexing.opening import open_index
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing import assert_same

R = TypeVar("R")


class ReversedExecutor:
    """Runs every call here, then hands the results back last first (a worst-case order),
    checking on the way that each task pickles as a remote executor would send it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        pickle.loads(pickle.dumps((work, list(tasks))))
        self.calls.extend(tasks)
        results = [(k, work(*args)) for k, args in enumerate(tasks)]
        yield from reversed(results)


class ThreadExecutor:
    """A third backend in a dozen lines: threads, results in completion order."""

    def run(
        self, work: Callable[..., R], tasks: Sequence[tuple[Any, ...]]
    ) -> Generator[tuple[int, R], None, None]:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {pool.submit(work, *args): k for k, args in enumerate(tasks)}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()


def _same_index(got: DatasetIndex, want: DatasetIndex) -> None:
    assert got.files == want.files
    assert got.skipped == want.skipped
    assert np.array_equal(got.samples, want.samples)
    for name, array in want.spans.items():
        assert np.array_equal(got.spans[name], array), name
    drop = {"arrays"}  # file names carry a fresh token
    assert {k: v for k, v in got.header.items() if k not in drop} == {
        k: v for k, v in want.header.items() if k not in drop
    }


@pytest.mark.parametrize("executor", [ReversedExecutor, ThreadExecutor, InlineExecutor])
def test_an_index_built_through_any_executor_equals_the_default(
    tmp_path: Path, executor: Callable[[], Any]
) -> None:
    paths = write_synthetic(tmp_path / "data", files=4, per_file=6, shape=(3,))
    want = build_index(tmp_path / "data", index=tmp_path / "default", jobs=1)
    got = build_index(tmp_path / "data", index=tmp_path / "custom", executor=executor())
    _same_index(got, want)
    ds = PickleDataset(tmp_path / "data", index=tmp_path / "custom")
    expected = [s for p in paths for s in oracle_samples(p)]
    for i, sample in enumerate(expected):
        assert_same(ds[i], sample)


def test_every_file_is_handed_to_the_executor_once(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "data", files=3, per_file=2, shape=(1,))
    executor = ReversedExecutor()
    index = build_index(tmp_path / "data", executor=executor)
    assert sorted(args[1] for args in executor.calls) == [f.path for f in index.files]
    assert [args[2] for args in executor.calls] == [0, 1, 2]  # files-table positions


def test_open_index_builds_through_the_given_executor(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "data", files=2, per_file=2, shape=(1,))
    executor = ReversedExecutor()
    index, _ = open_index(tmp_path / "data", executor=executor)
    assert len(executor.calls) == 2
    assert len(index) == 4


@pytest.mark.parametrize("executor", [ReversedExecutor, ThreadExecutor])
def test_bad_files_come_back_through_the_executor(
    tmp_path: Path, executor: Callable[[], Any]
) -> None:
    write_synthetic(tmp_path / "data", files=3, per_file=2, shape=(1,))
    bad = tmp_path / "data" / "part-00001.pkl"
    bad.write_bytes(b"not a pickle at all")
    index = build_index(tmp_path / "data", executor=executor(), skip_bad=True)
    assert [s["path"] for s in index.skipped] == ["part-00001.pkl"]
    assert [f.path for f in index.files] == ["part-00000.pkl", "part-00002.pkl"]
    with pytest.raises(errors.NotAPickleError) as info:
        build_index(tmp_path / "data", index=tmp_path / "strict", executor=executor())
    assert str(bad.resolve()) in str(info.value)


def test_the_default_executor_follows_jobs() -> None:
    assert isinstance(local_executor(1, 10), InlineExecutor)
    assert isinstance(local_executor(0, 10), InlineExecutor)
    assert isinstance(local_executor(4, 1), InlineExecutor)  # one file: no pool to start
    pool = local_executor(4, 10)
    assert isinstance(pool, ProcessPoolIndexExecutor)
    assert pool.jobs == 4
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        ProcessPoolIndexExecutor(0)


def _square(x: int) -> int:
    if x == 3:
        raise KeyError(x)
    return x * x


def test_the_process_pool_yields_results_and_raises_a_calls_error() -> None:
    results = dict(ProcessPoolIndexExecutor(2).run(_square, [(k,) for k in range(3)]))
    assert results == {0: 0, 1: 1, 2: 4}
    with pytest.raises(KeyError):
        list(ProcessPoolIndexExecutor(2).run(_square, [(k,) for k in range(5)]))
