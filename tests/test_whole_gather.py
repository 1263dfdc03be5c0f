"""Batches from files read whole (:mod:`pickleshard.read.whole.gather`): gathered field by field,
each sample held to the bounds the first time it is read from its cached copy.

Oracles: ``pickle.load`` of each file, ``default_collate`` of the samples read one by one."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pickleshard import PickleDataset, errors
from pickleshard.safety.bounds import measure
from test_batch import assert_collated
from test_batch_objects import check_batch, write
from test_object_ragged import ragged


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    files=st.lists(st.lists(ragged, min_size=1, max_size=8), min_size=1, max_size=3),
    protocol=st.sampled_from([2, 3, 4, 5]),
    seed=st.integers(0, 2**16),
)
def test_whole_file_batches_equal_pickle_load_and_default_collate(
    tmp_path_factory: pytest.TempPathFactory, files: list[list[Any]], protocol: int, seed: int
) -> None:
    folder = tmp_path_factory.mktemp("whole")
    oracle = write(folder, {"files": files, "protocol": protocol})
    ds = PickleDataset(folder, jobs=1, mode="whole")
    rng = np.random.default_rng(seed)
    for _ in range(2):  # the second epoch: samples already checked
        check_batch(ds, rng.permutation(len(ds)).tolist(), oracle)


def test_a_sample_over_the_bounds_is_refused_every_time_it_is_read(tmp_path: Path) -> None:
    xs: list[Any] = [{"t": [k]} for k in range(8)]
    xs[5] = {"t": list(range(100))}
    oracle = write(tmp_path / "d", {"files": [xs], "protocol": 4})
    limit = max(measure(s, None, None)[0] for k, s in enumerate(oracle) if k != 5)
    ds = PickleDataset(tmp_path / "d", jobs=1, mode="whole", max_sample_bytes=limit)
    good = [7, 0, 3, 1]
    for _ in range(2):
        assert_collated(list(ds.__getitems__(good)), [oracle[i] for i in good])
        with pytest.raises(errors.SampleTooLargeError, match="sample 5"):
            ds.__getitems__([2, 5, 4])  # its file's other samples passed; this one never does
    deep = PickleDataset(tmp_path / "d", jobs=1, mode="whole", max_depth=1)
    with pytest.raises(errors.SampleTooDeepError):
        deep.__getitems__([0])


def test_a_copy_loaded_again_is_checked_again(tmp_path: Path) -> None:
    """The flags belong to one decoded copy: a copy the cache let go and loaded again (here:
    changed in memory, as a copy of other values would be) is held to the bounds afresh."""
    xs = [[k] for k in range(6)]
    oracle = write(tmp_path / "d", {"files": [xs], "protocol": 5})
    ds = PickleDataset(tmp_path / "d", jobs=1, mode="whole", max_sample_bytes=100)
    assert_collated(list(ds.__getitems__([0, 1, 2])), [oracle[i] for i in (0, 1, 2)])
    reader = ds._batches
    first = ds._file(0)
    reader.whole = lambda pos: _bigger(first)  # another copy of the file, one sample larger
    with pytest.raises(errors.SampleTooLargeError, match="sample 1"):
        ds.__getitems__([0, 1, 2])


def _bigger(got: Any) -> Any:
    x, y = got.columns
    x = list(x)
    x[1] = list(range(50))
    return type(got)(got.layout, got.fields, [x, y])


def test_labels_past_int64_leave_the_int_column(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    ys = [1, 2**70, 3]
    with open(folder / "part0.pkl", "wb") as fh:
        pickle.dump(([{"a": k} for k in range(3)], ys), fh, protocol=4)
    ds = PickleDataset(folder, jobs=1, mode="whole")
    assert [s[1] for s in ds.__getitems__([2, 1, 0])] == [3, 2**70, 1]
