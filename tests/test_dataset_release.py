"""A dropped dataset lets go of its files at once, not at the next garbage collection.

Every reader, cache and batch path of a :class:`~pickleshard.PickleDataset` holds callbacks to
its owner weakly (:class:`~pickleshard.io.handles.WeakMethod`): with the cyclic collector off,
dropping the dataset closes every descriptor it opened (data files and index arrays) and unmaps
every map. A reference cycle anywhere on that path fails these tests.
"""

from __future__ import annotations

import gc
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pickleshard import PickleDataset
from pickleshard.io.handles import WeakMethod


def _held(root: Path) -> list[str]:
    """This process's descriptors and mappings of files under ``root``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            out.append(f"fd {target}")
    with open("/proc/self/maps") as fh:
        out += [f"map {line.split()[-1]}" for line in fh if str(root) in line]
    return out


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _data(root: Path, objects: bool) -> Path:
    root.mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        if objects:
            rows = [({"tokens": list(range(i % 7)), "text": f"s{i}"}, i) for i in range(300)]
        else:
            rows = [(rng.random((3, 8, 8), dtype=np.float32), i) for i in range(300)]
        with open(root / f"p{k}.pkl", "wb") as fh:
            pickle.dump(rows, fh, protocol=4 + k % 2)
    return root


@pytest.mark.parametrize("objects", [False, True])
@pytest.mark.parametrize("mode", ["span", "whole"])
def test_a_dropped_dataset_closes_its_files_without_a_collection(
    tmp_path: Path, no_collector: None, objects: bool, mode: str
) -> None:
    root = _data(tmp_path / "d", objects)
    PickleDataset(root)  # the index is built and written (then dropped as well)
    assert _held(root) == []
    ds = PickleDataset(root, mode=mode)  # type: ignore[arg-type]
    n = len(ds)
    got = [ds[0], ds[n - 1], *ds.__getitems__([5, n // 2, 1, n - 3])]
    assert len(got) == 6
    assert _held(root) != []  # it holds them while alive
    del ds, got
    assert _held(root) == []


def test_a_dataset_pickled_and_dropped_closes_its_copy_too(
    tmp_path: Path, no_collector: None
) -> None:
    root = _data(tmp_path / "d", objects=False)
    ds = PickleDataset(root)
    first = ds[3]
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker receives
    again = copy.__getitems__([3, 400])[0]
    np.testing.assert_array_equal(again[0], first[0])
    del ds, copy, first, again
    assert _held(root) == []


class _Owner:
    def __init__(self) -> None:
        self.calls = 0

    def bump(self, by: int = 1) -> int:
        self.calls += by
        return self.calls


def test_weak_method_calls_its_owner_pickles_with_it_and_never_keeps_it() -> None:
    owner = _Owner()
    call = WeakMethod(owner, "bump")
    assert call(2) == 2
    assert call(by=3) == 5
    owner.call = call  # type: ignore[attr-defined]  # owned by its owner: no cycle
    copy = pickle.loads(pickle.dumps(owner))
    assert copy.call() == 6  # the copy's method, on the copy
    assert owner.calls == 5
    del owner, copy
    with pytest.raises(ReferenceError, match="bump"):
        call()
    with pytest.raises(ReferenceError):
        pickle.dumps(call)
