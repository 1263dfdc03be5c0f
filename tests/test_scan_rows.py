"""The compiled row pass (``_cscan.walk_rows``, :mod:`pickleshard.scan.rows`): on a list of flat
rows it gives the scan the general walk gives (every array and field of the result equal, so
the index written is the same), read back it equals ``pickle.load``; on anything else it
answers None and leaves the walk's state as it found it, and the general walk decides."""

from __future__ import annotations

import io
import pickle
import tempfile
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picklegen import assert_same
from pickleshard import _cscan
from pickleshard import scan as scan_module
from pickleshard.errors import PickleshardError
from pickleshard.picklekit.walker import Walked
from pickleshard.read import SpanReader
from pickleshard.scan import ScanResult, scan_bytes, scan_file
from pickleshard.testing.oracle import reference_samples

_TEXT = st.text(max_size=6)
# a few strings drawn once and used in many rows: the pickler memoizes them, later rows GET them
_SHARED = st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=3)


def _scalars(shared: list[str], protocol: int) -> st.SearchStrategy[Any]:
    # bytes at protocol 2 are a call of _codecs.encode (a global: not a flat row)
    raw = st.binary(max_size=6) if protocol >= 3 else st.none()
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        _TEXT,
        raw,
        st.sampled_from(shared),
    )


def _value(shared: list[str], protocol: int) -> st.SearchStrategy[Any]:
    scalar = _scalars(shared, protocol)
    return st.one_of(scalar, st.lists(scalar, max_size=5))


@st.composite
def flat_rows(draw: st.DrawFn) -> tuple[list[Any], int]:
    """A list of flat rows (dicts of one key set, or tuples of one length) and a protocol."""
    shared = draw(_SHARED)
    n = draw(st.integers(1, 30))
    protocol = draw(st.integers(2, 5))
    if draw(st.booleans()):
        keys = draw(
            st.lists(st.one_of(_TEXT, st.sampled_from(shared)), min_size=1, max_size=4, unique=True)
        )
        rows: list[Any] = [{k: draw(_value(shared, protocol)) for k in keys} for _ in range(n)]
    else:
        width = draw(st.integers(1, 5))
        rows = [tuple(draw(_value(shared, protocol)) for _ in range(width)) for _ in range(n)]
    return rows, protocol


def _general(data: bytes) -> ScanResult:
    """The scan with the row pass turned off: the general walk and the node matching."""
    mp = pytest.MonkeyPatch()
    mp.setattr(scan_module, "walk_rows", lambda *a, **k: None)
    try:
        return scan_bytes(data, "t.pkl")
    finally:
        mp.undo()


def _facts(s: ScanResult) -> tuple[Any, ...]:
    return (s.meta(), {k: v.tolist() for k, v in s.arrays_dict().items()})


def _outcome(data: bytes, general: bool = False, engine: str = "auto") -> tuple[Any, ...]:
    """The scan's facts, or the package error it raised (class, message, offset)."""
    try:
        return _facts(_general(data) if general else scan_bytes(data, "t.pkl", engine=engine))
    except PickleshardError as exc:
        return (type(exc), str(exc), exc.offset)


def _row_pass(data: bytes) -> tuple[Walked, Any]:
    w = Walked("t.pkl", len(data), 0, [], [], array("q"), array("q"), array("q"), 0, "compiled")
    w.defs.append(7)  # state from an earlier pickle: kept as it was when the pass gives up
    w.strs[0] = 7
    return w, _cscan.walk_rows(data, 2, len(data), w)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=flat_rows())
def test_the_row_pass_scans_as_the_general_walk_and_reads_as_pickle_load(
    drawn: tuple[list[Any], int],
) -> None:
    rows, protocol = drawn
    data = pickle.dumps(rows, protocol=protocol)
    assert _row_pass(data)[1] is not None  # flat rows: the pass takes them
    general = _outcome(data, general=True)
    assert _outcome(data) == general
    assert _outcome(data, engine="python") == general
    if general[0] is not None and isinstance(general[0], type):  # refused by both alike
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.pkl"
        path.write_bytes(data)
        fast = scan_file(path)
        names, want = reference_samples([pickle.loads(data)], str(path))
        assert fast.fields == names
        with SpanReader(fast) as reader:
            for i in range(fast.num_samples):
                assert_same(reader.read_sample(i), want[i], _path=f"sample {i}")


_shared_list = [1, 2]
_shared_dict = {"k": 1}


@pytest.mark.parametrize(
    "obj",
    [
        [{"a": {"nested": 1}}],  # a dict inside a row
        [{"a": _shared_list}, {"a": _shared_list}],  # a GET of a container
        [(1, 2), (3,)],  # tuples of several lengths
        [(1, 2), {"a": 1}],  # rows of two kinds
        [{"a": np.zeros(2)}],  # a global
        [[1, 2], [3, 4]],  # lists are not rows
        ([{"a": 1}], [2]),  # a top-level tuple
        {"a": [{"b": 1}]},  # a top-level dict
        [],  # no rows
        [()],  # an empty tuple
        [_shared_dict, _shared_dict],  # the same row twice
        [{"a": [[1]]}],  # a list inside a list
    ],
)
def test_anything_else_is_left_to_the_general_walk(obj: Any) -> None:
    data = pickle.dumps(obj, protocol=5)
    w, got = _row_pass(data)
    assert got is None
    assert (w.defs.tolist(), w.strs, len(w.get_offs), w.skipped) == ([7], {0: 7}, 0, 0)
    assert _outcome(data) == _outcome(data, general=True)


def test_appended_pickles_and_damaged_bytes_get_the_general_walks_answer() -> None:
    rows = [{"a": i, "b": f"s{i}"} for i in range(50)]
    one = pickle.dumps(rows, protocol=5)
    cut = one[: len(one) // 2]
    for data in (one + one, one[:-1], cut, one[:-1] + b"\x00", one.replace(b"s1", b"s\xff", 1)):
        assert _outcome(data) == _outcome(data, general=True)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_batches_of_rows_and_keys_past_a_thousand(protocol: int) -> None:
    """Rows in several APPENDS batches, a row of several SETITEMS batches, FRAME headers."""
    rows = [{f"k{j}": j * i for j in range(1200)} for i in range(3)]
    many = [(i, str(i), [i] * 3) for i in range(2500)]
    for obj in (rows, many):
        data = pickle.dumps(obj, protocol=protocol)
        assert _row_pass(data)[1] is not None
        assert _facts(scan_bytes(data, "t.pkl")) == _facts(_general(data))


def test_the_scan_of_a_file_of_rows_takes_the_row_pass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = pickle.dumps([{"x": i, "y": [i, i]} for i in range(10)], protocol=5)
    path = tmp_path / "t.pkl"
    path.write_bytes(data)
    calls = []
    real = scan_module.walk_opcodes

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(scan_module, "walk_opcodes", counting)
    scan = scan_file(path)
    assert calls == []
    assert (scan.layout, scan.engine) == ("dict_rows", "compiled")
    with SpanReader(scan) as reader:
        assert reader.read_sample(3) == (3, [3, 3])
    assert pickle.load(io.BytesIO(data))[3] == {"x": 3, "y": [3, 3]}
