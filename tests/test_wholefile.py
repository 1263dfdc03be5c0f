"""Whole-file loading: every bad file gets its own error naming it; loads run with the GC paused."""

from __future__ import annotations

import gc
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import (
    BAD_FILES,
    LAYOUT_CASES,
    WritePickle,
    outcome_without_privileges,
)
from pickleshard import errors
from pickleshard.read.whole.load import load_file, load_layout
from pickleshard.testing import assert_same


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_load_file_classifies_bad_bytes(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "bad.pkl"
    path.write_bytes(data)
    with pytest.raises(getattr(errors, expected)) as info:
        load_file(path)
    assert str(path) in str(info.value)
    assert info.value.path == str(path)


@pytest.mark.parametrize(("obj", "expected"), LAYOUT_CASES.values(), ids=LAYOUT_CASES)
def test_load_layout_rejects_unsupported_top_level(
    write_pickle: WritePickle, obj: object, expected: str
) -> None:
    path = write_pickle("odd.pkl", obj)
    assert_same(load_file(path), obj)  # it is a fine pickle ...
    with pytest.raises(getattr(errors, expected)) as info:
        load_layout(path)  # ... of no layout we can index
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "obj",
    [([1, 2, 3], [1, 2]), {"x": [1, 2, 3], "y": [0, 1]}, (np.zeros((3, 2)), [0, 1])],
    ids=["tuple", "dict", "ndarray"],
)
def test_load_layout_reports_both_lengths(write_pickle: WritePickle, obj: object) -> None:
    path = write_pickle("mismatch.pkl", obj)
    with pytest.raises(errors.FieldLengthMismatchError) as info:
        load_layout(path)
    message = str(info.value)
    assert str(path) in message
    assert "= 3" in message
    assert "= 2" in message


def test_load_file_of_a_directory_is_unreadable(unreadable_dir_pkl: Path) -> None:
    with pytest.raises(errors.UnreadableFileError) as info:
        load_file(unreadable_dir_pkl)
    assert str(unreadable_dir_pkl) in str(info.value)
    assert isinstance(info.value, OSError)


def test_load_file_of_a_missing_path_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "gone.pkl"
    with pytest.raises(errors.UnreadableFileError, match=re.escape(str(path))):
        load_file(path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="drops privileges in a forked child")
def test_load_file_without_permission_is_unreadable(locked_file: Path) -> None:
    err = outcome_without_privileges(lambda: load_file(locked_file))
    assert isinstance(err, errors.UnreadableFileError)
    assert str(locked_file) in str(err)
    assert "Permission denied" in str(err)
    assert outcome_without_privileges(lambda: load_file(locked_file.with_name("a.pkl"))) is None


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_load_file_equals_pickle_load(write_pickle: WritePickle, protocol: int) -> None:
    obj = ([np.arange(4, dtype=np.int16) * i for i in range(5)], ["a", "b", "c", "d", "e"])
    path = write_pickle(f"p{protocol}.pkl", obj, protocol=protocol)
    with open(path, "rb") as fh:
        assert_same(load_file(path), pickle.load(fh))
    decoded = load_layout(path)
    assert (decoded.layout, decoded.fields, decoded.num_samples) == ("columns", ("x", "y"), 5)


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize(
    "objs",
    [
        [([1, 2], ["a", "b"]), ([3], ["c"])],  # chunks of one layout
        [([1, 2], ["a", "b"]), [(3, "c")]],  # chunks of two layouts, same fields
        [(1, "a"), (2, "b"), (3, "c")],  # one sample per pickle
        [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}],  # one dict sample per pickle
        [5, "x", None],  # single-field samples
        [(np.zeros((2, 3)), [0, 1]), (np.ones((1, 3)), [2])],  # array fields concatenate
    ],
    ids=["chunks", "mixed_chunks", "tuples", "dicts", "objects", "arrays"],
)
def test_load_layout_reads_every_appended_pickle(
    tmp_path: Path, objs: list[Any], protocol: int
) -> None:
    from picklegen import oracle

    path = tmp_path / "appended.pkl"
    with open(path, "wb") as fh:
        for obj in objs:
            pickle.dump(obj, fh, protocol=protocol)
    fields, want = oracle(path)
    decoded = load_layout(path)
    assert decoded.fields == fields
    assert decoded.layout.startswith("appended_")
    assert decoded.num_samples == len(want)
    for i, sample in enumerate(want):
        assert_same(tuple(col[i] for col in decoded.columns), sample)
    assert_same(load_file(path), objs[0])  # load_file: the first pickle only


def test_appended_samples_of_different_shapes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd.pkl"
    with open(path, "wb") as fh:
        for obj in [(1, 2), (3,)]:
            pickle.dump(obj, fh)
    with pytest.raises(errors.UnsupportedLayoutError, match="different shapes"):
        load_layout(path)
    with open(path, "ab") as fh:
        fh.write(b"trailing junk")
    with pytest.raises(errors.NotAPickleError, match="after pickle ending at"):
        load_layout(path)


class _Probe(Exception):
    pass


@pytest.fixture
def gc_seen_in_find_class(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every restricted ``find_class`` call records whether the collector was enabled."""
    from pickleshard.safety import policy as safety

    seen: list[bool] = []
    original = safety.RestrictedUnpickler.find_class

    def find_class(self: Any, module: str, name: str) -> Any:
        seen.append(gc.isenabled())
        return original(self, module, name)

    monkeypatch.setattr(safety.RestrictedUnpickler, "find_class", find_class)
    return seen


def _raising_find_class(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    from pickleshard.safety import policy as safety

    def find_class(self: Any, module: str, name: str) -> Any:
        assert not gc.isenabled()
        raise exc

    monkeypatch.setattr(safety.RestrictedUnpickler, "find_class", find_class)


def test_loads_run_without_the_cyclic_collector(
    write_pickle: WritePickle, gc_seen_in_find_class: list[bool]
) -> None:
    path = write_pickle("arrays.pkl", ([np.zeros(3), np.ones(3)], [0, 1]))
    assert gc.isenabled()
    assert_same(load_layout(path).columns[1], [0, 1])
    assert gc_seen_in_find_class
    assert not any(gc_seen_in_find_class)
    assert gc.isenabled()


@pytest.mark.parametrize(
    ("exc", "raised"),
    [
        (_Probe("boom"), errors.CorruptPickleError),  # an error the loader classifies
        (KeyboardInterrupt(), KeyboardInterrupt),  # an interrupt that goes straight through
        (MemoryError(), errors.CorruptPickleError),
    ],
    ids=["error", "interrupt", "memory"],
)
def test_the_collector_is_restored_on_every_exit(
    write_pickle: WritePickle,
    monkeypatch: pytest.MonkeyPatch,
    exc: BaseException,
    raised: type[BaseException],
) -> None:
    path = write_pickle("arrays.pkl", ([np.zeros(3)], [0]))
    _raising_find_class(monkeypatch, exc)
    assert gc.isenabled()
    with pytest.raises(raised):
        load_layout(path)
    assert gc.isenabled()


def test_a_collector_disabled_by_the_caller_stays_disabled(
    write_pickle: WritePickle, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_pickle("arrays.pkl", ([np.zeros(3)], [0]))
    gc.disable()
    try:
        load_layout(path)
        assert not gc.isenabled()
        _raising_find_class(monkeypatch, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            load_layout(path)
        assert not gc.isenabled()
    finally:
        gc.enable()
