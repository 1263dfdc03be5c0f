"""pickleshard.scan.ahead: each file's examined bytes read while the one before is walked.

The oracle is the scan without it (a file's own map, no scratch) and ``pickle.load`` behind that
(test_scan_scratch): whatever order the files are taken in, whatever happens to a file between
its read ahead and its scan, the scan's facts and errors are those of a scan that read nothing
ahead, and what was read ahead is used only for the file it was read from.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picklegen import build, datasets, write
from pickleshard.errors import PickleshardError
from pickleshard.scan import ScanResult, scan_file
from pickleshard.scan import ahead as ahead_module
from pickleshard.scan import scratch as scratch_module
from pickleshard.scan.ahead import DEEPEST, ScanAhead
from pickleshard.scan.scratch import scratch_scope


def _facts(s: ScanResult) -> tuple[Any, ...]:
    return (s.meta(), {k: v.tolist() for k, v in s.arrays_dict().items()})


def _outcome(path: Path) -> tuple[Any, ...]:
    try:
        return _facts(scan_file(path))
    except PickleshardError as exc:
        return (type(exc), str(exc), exc.offset)


class _Counted(ScanAhead):
    """A ScanAhead that counts the files it handed over, and the most reads it had in flight."""

    def __init__(self, paths: list[str], budget: int) -> None:
        self.handed: list[str] = []
        self.deepest = 0
        super().__init__(paths, budget)

    def _start(self, k: int) -> bool:
        started = super()._start(k)
        self.deepest = max(self.deepest, len(self._pending))
        return started

    def take(self, source: Any) -> Any:
        got = super().take(source)
        if got is not None:
            self.handed.append(source.name)
        return got


def _scope(paths: list[Path]) -> Any:
    return scratch_scope(ahead=partial(_Counted, [os.fspath(p) for p in paths]))


def _arrays(path: Path, n: int, value: float, side: int = 16) -> Path:
    rows = [(np.full((3, side, side), value + i, np.float32), i) for i in range(n)]
    path.write_bytes(pickle.dumps(rows, protocol=5))
    return path


def test_files_taken_in_order_are_all_read_ahead_and_scan_as_without(tmp_path: Path) -> None:
    paths = [_arrays(tmp_path / f"p{k}.pkl", 300 + 50 * k, k, 8 + 8 * (k % 2)) for k in range(5)]
    want = [_outcome(p) for p in paths]
    with _scope(paths) as scratch:
        got = [_outcome(p) for p in paths]
        assert scratch.ahead.handed == [os.fspath(p) for p in paths]
    assert got == want


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    specs=st.lists(datasets(), min_size=1, max_size=4),
    order=st.lists(st.integers(0, 3), max_size=8),
)
def test_any_order_of_scans_gives_the_scans_without_it(
    specs: list[dict[str, Any]], order: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for k, spec in enumerate(specs):
            path = Path(tmp) / f"d{k}.pkl"
            write(path, build(spec["layout"], spec["columns"], spec["names"]), spec["protocol"])
            paths.append(path)
        want = [_outcome(p) for p in paths]
        taken = [k for k in order if k < len(paths)]
        with _scope(paths):
            got = [_outcome(paths[k]) for k in taken]
        assert got == [want[k] for k in taken]


@pytest.mark.parametrize("cached", [True, False])
def test_files_read_whole_from_storage_are_read_two_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    paths = [_arrays(tmp_path / f"p{k}.pkl", 300 + 50 * k, k) for k in range(6)]
    want = [_outcome(p) for p in paths]
    # a file the page cache does not hold is read whole: here every file (tmpfs keeps them all)
    monkeypatch.setattr(scratch_module, "_cached", lambda fd, size: cached)
    with _scope(paths) as scratch:
        got = [_outcome(p) for p in paths]
        ahead = scratch.ahead
        assert ahead.handed == [os.fspath(p) for p in paths]
        assert ahead.deepest == (1 if cached else DEEPEST)
        assert len(ahead._fillers) == ahead.deepest
        assert len(ahead._scratches) == ahead.deepest + 1
    assert got == want


def test_a_file_replaced_after_its_read_ahead_is_read_again(tmp_path: Path) -> None:
    paths = [_arrays(tmp_path / f"p{k}.pkl", 200, k) for k in range(3)]
    with _scope(paths) as scratch:
        first = _outcome(paths[0])  # p1 is read ahead meanwhile
        os.replace(_arrays(tmp_path / "new.pkl", 120, 50, side=8), paths[1])
        got = _outcome(paths[1])
        assert os.fspath(paths[1]) not in scratch.ahead.handed
    assert first == _outcome(paths[0])
    assert got == _outcome(paths[1])
    assert scan_file(paths[1]).num_samples == 120


def test_a_file_changed_in_place_after_its_read_ahead_is_read_again(tmp_path: Path) -> None:
    paths = [_arrays(tmp_path / f"p{k}.pkl", 200, k) for k in range(2)]
    with _scope(paths) as scratch:
        _outcome(paths[0])
        data = pickle.dumps([(np.zeros((3, 4, 4), np.float32), 0)] * 7, protocol=4)
        with open(paths[1], "r+b") as fh:  # same inode, new bytes, new size and mtime
            fh.write(data)
            fh.truncate()
        got = _outcome(paths[1])
        assert os.fspath(paths[1]) not in scratch.ahead.handed
    assert got == _outcome(paths[1])
    assert scan_file(paths[1]).num_samples == 7


def test_bad_files_raise_the_errors_of_a_scan_without_it(tmp_path: Path) -> None:
    good = _arrays(tmp_path / "a.pkl", 100, 0)
    cut = tmp_path / "b.pkl"
    cut.write_bytes(good.read_bytes()[:-500])
    junk = tmp_path / "c.pkl"
    junk.write_bytes(b"not a pickle at all" * 100)
    empty = tmp_path / "d.pkl"
    empty.write_bytes(b"")
    paths = [good, cut, junk, empty, _arrays(tmp_path / "e.pkl", 80, 1)]
    want = [_outcome(p) for p in paths]
    assert isinstance(want[1][0], type)
    assert isinstance(want[2][0], type)
    with _scope(paths):
        assert [_outcome(p) for p in paths] == want


def test_a_scope_left_with_a_read_in_flight_or_unread_files_stops_cleanly(
    tmp_path: Path,
) -> None:
    paths = [_arrays(tmp_path / f"p{k}.pkl", 2000, k) for k in range(3)]
    for _ in range(5):
        with _scope(paths):
            pass  # p0's read may still run: close waits for it

    def scan_then_fail() -> None:
        with _scope(paths):
            _outcome(paths[0])  # p1's read starts
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        scan_then_fail()


def test_without_the_compiled_core_nothing_is_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ahead_module, "CORE", None)
    paths = [_arrays(tmp_path / f"p{k}.pkl", 100, k) for k in range(2)]
    want = [_outcome(p) for p in paths]
    with _scope(paths) as scratch:
        assert [_outcome(p) for p in paths] == want
        assert scratch.ahead.handed == []


def test_the_bytes_fetched_for_a_file_read_ahead_are_counted_for_it(tmp_path: Path) -> None:
    paths = [_arrays(tmp_path / f"p{k}.pkl", 400, k) for k in range(2)]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    with _scope(paths) as scratch:
        scans = [scan_file(p) for p in paths]
        assert len(scratch.ahead.handed) == 2
    for p, s in zip(paths, scans, strict=True):
        # None where /proc/.../io is missing; 0 on a file system with no block device (tmpfs)
        assert s.bytes_fetched is None or 0 <= s.bytes_fetched <= 2 * p.stat().st_size
