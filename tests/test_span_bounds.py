"""Span reads hold every sample to the policy's bounds (``max_sample_bytes``, ``max_depth``) in
the read itself: the compiled loader tests them in the call that reads the sample (one sample or
a batch), the Python paths with :func:`~pickleshard.safety.bounds.check_sample`; the dataset no longer
checks span samples again. Each path is forced and checked to be the one that ran."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import PickleDataset
from pickleshard.errors import SampleTooDeepError, SampleTooLargeError
from pickleshard.read import BATCH_READ_MIN, SpanReader
from pickleshard.read import reader as reader_module
from pickleshard.safety.bounds import check_sample
from pickleshard.scan import scan_file

pytest.importorskip("pickleshard._cscan", reason="the compiled core is not built")

N = 40  # samples per file: enough for a batch read field by field (BATCH_READ_MIN)


def _write(folder: Path, xs: list[Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "f.pkl"
    path.write_bytes(pickle.dumps((xs, list(range(len(xs)))), protocol=4))
    return path


def _arrays(folder: Path, big: int) -> Path:
    """12-byte float32 arrays, sample ``big`` a 4 KB one (same dtype: one array field)."""
    xs = [np.full(3 if i != big else 1024, i, np.float32) for i in range(N)]
    return _write(folder, xs)


def _objects(folder: Path, big: int) -> Path:
    xs = [{"tokens": list(range(3 if i != big else 500)), "text": f"w{i}"} for i in range(N)]
    return _write(folder, xs)


def _compiled(ds: PickleDataset) -> SpanReader:
    ds[0]
    reader = ds.span_files.reader(0)
    assert reader.plan is not None
    assert reader.plan.compiled
    return reader


@pytest.mark.parametrize("make", [_arrays, _objects])
def test_compiled_reads_refuse_a_sample_past_max_sample_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any
) -> None:
    path = make(tmp_path / "d", big=7)
    ds = PickleDataset(tmp_path / "d", mode="span", max_sample_bytes=1000)
    reader = _compiled(ds)
    calls: list[int] = []

    def spy(sample: Any, path: str, label: int, *bounds: Any) -> None:
        calls.append(label)  # the reference runs only where the compiled test cannot decide
        check_sample(sample, path, label, *bounds)

    monkeypatch.setattr(reader_module, "check_sample", spy)
    for i in (2, 6, 8, N - 1):  # once in Python (a fresh loader's caches fill), then compiled
        assert ds[i][1] == i
    calls.clear()
    executed: list[int] = []
    real_execute = reader._execute
    reader._execute = lambda plan, i, label: executed.append(i) or real_execute(plan, i, label)  # type: ignore[method-assign]
    for i in (2, 6, 8, N - 1):
        assert ds[i][1] == i
    assert executed == []
    assert calls == []
    with pytest.raises(SampleTooLargeError) as info:
        ds[7]
    assert str(path) in str(info.value)
    assert info.value.sample == 7
    assert calls == [7]
    for batch in ([9, 7, 3], list(range(N))):  # one compiled call; field by field (arrays)
        assert len(batch) < BATCH_READ_MIN or len(batch) == N
        with pytest.raises(SampleTooLargeError) as info:
            ds.__getitems__(batch)
        assert info.value.sample == 7
    good = [i for i in range(N) if i != 7]
    assert [s[1] for s in ds.__getitems__(good)] == good
    roomy = PickleDataset(tmp_path / "d", mode="span", max_sample_bytes=None)
    assert roomy[7][1] == 7  # no bound: read


def test_compiled_reads_refuse_a_sample_past_max_depth(tmp_path: Path) -> None:
    xs: list[Any] = [[i] for i in range(N)]
    deep: Any = 5
    for _ in range(30):
        deep = [deep]
    xs[4] = deep
    _write(tmp_path / "d", xs)
    ds = PickleDataset(tmp_path / "d", mode="span", max_depth=20)
    _compiled(ds)
    assert ds[3] == ([3], 3)
    with pytest.raises(SampleTooDeepError) as info:
        ds[4]
    assert info.value.sample == 4
    with pytest.raises(SampleTooDeepError):
        ds.__getitems__([2, 4, 5])


def test_a_sample_the_compiled_test_cannot_decide_goes_to_the_reference(tmp_path: Path) -> None:
    """A set is not a type the compiled walk knows: check_sample measures it (and refuses
    it when it is too big, naming the sample)."""
    xs: list[Any] = [{i} for i in range(N)]
    xs[5] = set(range(1000))
    path = _write(tmp_path / "d", xs)
    ds = PickleDataset(tmp_path / "d", mode="span", max_sample_bytes=2000)
    assert ds[1] == ({1}, 1)
    with pytest.raises(SampleTooLargeError) as info:
        ds[5]
    assert str(path) in str(info.value)
    assert info.value.sample == 5


def test_python_paths_check_bounds_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _objects(tmp_path / "d", big=7)
    monkeypatch.setattr(SpanReader, "_make_loader", lambda self, fd: None)  # no compiled reads
    ds = PickleDataset(tmp_path / "d", mode="span", max_sample_bytes=1000)
    assert ds[6][1] == 6
    reader = ds.span_files.reader(0)
    assert reader.plan is not None
    assert not reader.plan.compiled
    with pytest.raises(SampleTooLargeError):
        ds[7]
    for batch in ([9, 7, 3], list(range(N))):
        with pytest.raises(SampleTooLargeError) as info:
            ds.__getitems__(batch)
        assert info.value.sample == 7


def test_a_reader_without_bounds_checks_none(tmp_path: Path) -> None:
    """SpanReader's own default: bounds are the caller's (only a dataset's readers have them)."""
    path = _objects(tmp_path / "d", big=7)
    reader = SpanReader(scan_file(path))
    assert reader.bounds is None
    assert len(reader.read_sample(7)[0]["tokens"]) == 500
    bounded = SpanReader(scan_file(path), bounds=(1000, None))
    with pytest.raises(SampleTooLargeError):
        bounded.read_sample(7)
    assert bounded.read_samples([1, 2])[1][1] == 2
