"""The scanner: spans, layouts and field names as whole-file mode sees them; what it reads; what
it refuses, and the errors it raises on bad bytes."""

from __future__ import annotations

import functools
import io
import json
import pickle
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import BAD_FILES, LAYOUT_CASES
from picklegen import assert_same, oracle
from pickleshard import errors
from pickleshard import scan as scan_module
from pickleshard.errors import (
    CorruptPickleError,
    FieldLengthMismatchError,
    NotSpanIndexableError,
    TruncatedPickleError,
)
from pickleshard.read import SpanReader
from pickleshard.scan import ScanResult, scan_bytes, scan_file
from pickleshard.scan.layouts import decode_layout


@pytest.fixture(autouse=True, params=["python", "compiled"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs twice: with the reference opcode walker and with its compiled twin."""
    here = sys.modules[__name__]
    for name in ("scan_file", "scan_bytes"):
        scan = functools.partial(getattr(scan_module, name), engine=request.param)
        monkeypatch.setattr(here, name, scan)
    return str(request.param)


def _dump(tmp_path: Path, obj: Any, protocol: int = 5, name: str = "f.pkl") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def _read_all(scan: ScanResult, **kwargs: Any) -> list[tuple[Any, ...]]:
    with SpanReader(scan, **kwargs) as reader:
        return [reader.read_sample(i) for i in range(scan.num_samples)]


def _agrees(path: Path, **kwargs: Any) -> ScanResult:
    scan = scan_file(path, **{k: v for k, v in kwargs.items() if k == "encoding"})
    names, want = oracle(path)
    assert scan.fields == names
    for general in (False, True):
        for got, w in zip(_read_all(scan, general=general, **kwargs), want, strict=True):
            assert_same(got, w)
    return scan


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize(
    ("obj", "layout", "fields"),
    [
        (([1, 2], ["a", "b"]), "columns", ("x", "y")),
        ([[1, 2], [3, 4], [5, 6]], "columns", ("x", "y", "f2")),
        (
            (list(range(5)), tuple(range(5)), list("abcde"), [None] * 5),
            "columns",
            ("x", "y", "f2", "f3"),
        ),
        ({"img": [1, 2], 3: ["a", "b"]}, "dict_columns", ("img", "3")),
        ([(1, "a", 2.5), (2, "b", 3.5)], "rows", ("x", "y", "f2")),
        ([{"a": 1, "b": 2}, {"b": 3, "a": 4}], "dict_rows", ("a", "b")),
    ],
)
def test_layouts_and_field_names_match_whole_file_mode(
    tmp_path: Path, obj: Any, layout: str, fields: tuple[str, ...], protocol: int
) -> None:
    path = _dump(tmp_path, obj, protocol)
    scan = _agrees(path)
    decoded = decode_layout(pickle.loads(path.read_bytes()), path)
    assert (scan.layout, scan.fields) == (decoded.layout, decoded.fields) == (layout, fields)
    assert scan.kinds == ("pickle",) * len(fields)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_batches_memo_ids_and_frames(tmp_path: Path, protocol: int) -> None:
    # 2001 items: two APPENDS batches and a lone APPEND; ids past 255 (LONG_BINPUT); many
    # FRAMEs that spans cross; repeated strings and dict keys referenced across samples.
    words = [f"w{i % 300}" for i in range(2001)]
    xs = [{"word": w, "n": i, "arr": np.full(3, i, np.int16)} for i, w in enumerate(words)]
    path = _dump(tmp_path, (xs, words, [(w, w) for w in words]), protocol)
    scan = _agrees(path)
    assert scan.num_samples == 2001
    assert len(scan.shared.keys) > 3


def test_dict_rows_with_more_than_a_batch_of_keys(tmp_path: Path) -> None:
    rows = [{f"k{j}": i * j for j in range(1200)} for i in range(3)]
    scan = _agrees(_dump(tmp_path, rows, 4))
    assert scan.layout == "dict_rows"
    assert len(scan.fields) == 1200


def test_array_field_rows_are_byte_ranges(tmp_path: Path) -> None:
    big = np.arange(40 * 6, dtype=">f8").reshape(40, 2, 3)
    for protocol in (3, 4, 5):
        path = _dump(tmp_path, {"x": big, "y": list(range(40))}, protocol)
        scan = _agrees(path)
        assert scan.kinds == ("array_row", "pickle")
        assert (scan.ends[:, 0] - scan.starts[:, 0] == 48).all()
        raw = path.read_bytes()
        row = np.frombuffer(raw[scan.starts[7, 0] : scan.ends[7, 0]], ">f8")
        assert (row == big[7].ravel()).all()
        assert (scan.memo_base[:, 0] == -1).all()


@pytest.mark.parametrize(
    ("field", "why"),
    [
        (np.asfortranarray(np.ones((4, 3))), "order"),
        (np.ones((4, 3)).T.copy().T, "order"),
        (np.array([[1], "a", None, 2.0], dtype=object), "object"),
    ],
)
def test_array_fields_whose_rows_are_not_ranges_are_refused(
    tmp_path: Path, field: np.ndarray, why: str
) -> None:
    path = _dump(tmp_path, (field, [1, 2, 3, 4]), 5)
    with pytest.raises(NotSpanIndexableError) as info:
        scan_file(path)
    assert why in info.value.reason


def test_protocol_2_array_field_is_refused_but_array_samples_are_not(tmp_path: Path) -> None:
    with pytest.raises(NotSpanIndexableError, match="latin-1"):
        scan_file(_dump(tmp_path, (np.ones((3, 2)), [1, 2, 3]), 2))
    _agrees(_dump(tmp_path, ([np.ones(2) * i for i in range(3)], [1, 2, 3]), 2))


def test_scan_reads_a_small_fraction_of_a_payload_heavy_file(tmp_path: Path) -> None:
    xs = [np.full(150_000, i, np.float32) for i in range(30)]  # 600 KB each, 18 MB in all
    path = _dump(tmp_path, (xs, list(range(30))), 5)
    scan = scan_file(path)
    assert scan.num_samples == 30
    assert scan.bytes_read < scan.size / 100, (scan.bytes_read, scan.size)


@pytest.mark.parametrize(("case", "data", "expected"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_files_raise_the_whole_file_errors(
    tmp_path: Path, case: str, data: bytes, expected: str
) -> None:
    path = tmp_path / f"{case}.pkl"
    path.write_bytes(data)
    with pytest.raises(errors.PickleshardError) as info:
        scan_file(path)
    if data[:1] == b"\x80":  # protocol 2+: the same class as whole-file mode
        assert type(info.value).__name__ == expected, info.value
    else:  # protocol 0/1 or not a pickle: whole-file mode decides
        assert isinstance(info.value, (NotSpanIndexableError, getattr(errors, expected)))
    assert str(path) in str(info.value)


def _frame(body: bytes) -> bytes:
    return b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body


@pytest.mark.parametrize(
    ("data", "error", "offset"),
    [
        (
            b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"abc.",
            TruncatedPickleError,
            2,
        ),  # BINBYTES8
        (
            b"\x80\x05\x96" + struct.pack("<Q", 2**63 + 5) + b".",
            TruncatedPickleError,
            2,
        ),  # BYTEARRAY8
        (b"\x80\x02T" + struct.pack("<i", -5) + b"abc.", CorruptPickleError, 2),  # BINSTRING < 0
        (b"\x80\x02\x8b" + struct.pack("<i", -1) + b".", CorruptPickleError, 2),  # LONG4 < 0
        (b"\x80\x03B" + struct.pack("<I", 100) + b"abc.", TruncatedPickleError, 2),  # BINBYTES
        (b"\x80\x04\x95" + struct.pack("<Q", 10**9) + b"N.", TruncatedPickleError, 2),  # FRAME
        (b"\x80\x04cbuiltins", TruncatedPickleError, 2),  # GLOBAL without newline
        (_frame(b"K\x01\xff."), CorruptPickleError, 13),  # unknown opcode
        (_frame(b"K\x01K\x02e."), CorruptPickleError, 15),  # APPENDS without MARK
        (_frame(b"(K\x01"), TruncatedPickleError, 14),  # no STOP
    ],
)
def test_bad_lengths_and_opcodes_name_the_file_and_offset(
    data: bytes, error: type[Exception], offset: int
) -> None:
    with pytest.raises(error) as info:
        scan_bytes(data, "bad.pkl")
    assert type(info.value) is error
    assert info.value.path == "bad.pkl"
    assert info.value.offset == offset
    assert "bad.pkl" in str(info.value)


@pytest.mark.parametrize("protocol", [0, 1])
def test_protocols_0_and_1_are_not_span_indexable(tmp_path: Path, protocol: int) -> None:
    with pytest.raises(NotSpanIndexableError) as info:
        scan_file(_dump(tmp_path, ([1, 2], [3, 4]), protocol))
    assert "protocol 0 or 1" in info.value.reason
    assert pickle.loads(pickle.dumps(info.value)).reason == info.value.reason


class _WithPersistentIds(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return "ext" if obj == "external" else None


def _reused_pickler(protocol: int) -> bytes:
    buf = io.BytesIO()
    shared = ["shared", "list"]
    p = pickle.Pickler(buf, protocol=protocol)
    p.dump(([shared], [1]))
    p.dump(([shared], [2]))  # the second pickle GETs the first one's memo entry
    return buf.getvalue()


def _persistent() -> bytes:
    buf = io.BytesIO()
    _WithPersistentIds(buf, protocol=4).dump((["a", "external"], [1, 2]))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_persistent, "persistent id"),
        (lambda: _reused_pickler(2), "never stored"),
        (lambda: _reused_pickler(4), "never stored"),
        (
            lambda: pickle.dumps(([1], [2]), protocol=4) + b"garbage",
            "are not a protocol 4 pickle",
        ),
        (
            lambda: pickle.dumps(([1], [2]), protocol=4) + pickle.dumps(([1], [2]), protocol=5),
            "are not a protocol 4 pickle",
        ),
        (lambda: b"\x80\x04]\x94(K\x01K\x022e\x85\x94.", "DUP"),
        (lambda: b"\x80\x04]\x94(K\x01h\x00e]\x94K\x01a\x86\x94.", "outside every sample"),
        (lambda: pickle.dumps(5, protocol=4), "not a layout"),
    ],
)
def test_what_the_scanner_cannot_prove_is_refused_with_a_reason(make: Any, reason: str) -> None:
    with pytest.raises(NotSpanIndexableError) as info:
        scan_bytes(make(), "r.pkl")
    assert reason in info.value.reason, info.value.reason


@pytest.mark.parametrize(("case", "obj_and_error"), LAYOUT_CASES.items())
def test_objects_that_are_not_layouts(
    tmp_path: Path, case: str, obj_and_error: tuple[Any, str]
) -> None:
    with pytest.raises(NotSpanIndexableError):
        scan_file(_dump(tmp_path, obj_and_error[0], 4))


def test_unequal_fields_raise_like_whole_file_mode(tmp_path: Path) -> None:
    with pytest.raises(FieldLengthMismatchError, match="len\\(x\\) = 3, len\\(y\\) = 2"):
        scan_file(_dump(tmp_path, ([1, 2, 3], [1, 2]), 4))


def test_self_references_inside_a_sample(tmp_path: Path) -> None:
    a: list[Any] = [1]
    a.append(a)
    t = ([a],)
    a.append(t)  # a tuple whose only item refers back to it: POP + GET in the stream
    d: dict[str, Any] = {}
    d["me"] = d
    inner: list[Any] = []
    u = (inner,)
    inner.append(u)  # pickled first, u is written twice and the first copy POPped
    for protocol in (2, 4, 5):
        path = _dump(tmp_path, ([u, a, d, t, a], [0, 1, 2, 3, 4]), protocol)
        assert b"0h" in path.read_bytes() or b"0j" in path.read_bytes()  # POP then BINGET
        got = [s[0] for s in _read_all(scan_file(path))]
        assert got[0][0][0] is got[0]
        assert got[1][1] is got[1]
        assert got[2]["me"] is got[2]
        assert got[3][0][0][2] is got[3]


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_appended_pickles(tmp_path: Path, protocol: int) -> None:
    chunks = tmp_path / "chunks.pkl"
    chunks.write_bytes(
        b"".join(pickle.dumps(([i, i + 1], ["a", "b"]), protocol=protocol) for i in range(3))
    )
    assert _agrees(chunks).layout == "appended_columns"
    samples = tmp_path / "samples.pkl"
    samples.write_bytes(
        b"".join(pickle.dumps((np.ones(3) * i, i), protocol=protocol) for i in range(4))
    )
    scan = _agrees(samples)
    assert (scan.layout, scan.fields, scan.num_samples) == ("appended_samples", ("x", "y"), 4)
    dicts = tmp_path / "dicts.pkl"
    dicts.write_bytes(
        b"".join(pickle.dumps({"a": i, "b": "s"}, protocol=protocol) for i in range(3))
    )
    assert _agrees(dicts).layout == "appended_dict_samples"
    single = tmp_path / "single.pkl"
    single.write_bytes(b"".join(pickle.dumps(i * 1.5, protocol=protocol) for i in range(3)))
    assert _agrees(single).fields == ("x",)


def test_stored_form_round_trips_through_json_and_npy(tmp_path: Path) -> None:
    xs = [{"w": f"s{i % 3}", "a": np.arange(i, dtype=np.float32)} for i in range(50)]
    path = _dump(tmp_path, {"x": xs, "y": np.arange(50, dtype=">i2"), "z": list(range(50))}, 4)
    scan = scan_file(path)
    assert scan.arrays[1] is not None
    assert scan.arrays[1].swap
    meta = json.loads(json.dumps(scan.meta()))
    arrays = {}
    for name, arr in scan.arrays_dict().items():
        np.save(tmp_path / f"{name}.npy", arr)
        arrays[name] = np.load(tmp_path / f"{name}.npy", mmap_mode="r")
    stored = ScanResult.from_stored(path, meta, arrays)
    assert stored.fields == scan.fields
    assert stored.arrays == scan.arrays
    assert stored.shared == scan.shared
    for got, want in zip(_read_all(stored), _read_all(scan), strict=True):
        assert_same(got, want)


@pytest.mark.parametrize("protocol", [2, 4])
def test_spans_with_hundreds_of_memo_ids_and_externals(tmp_path: Path, protocol: int) -> None:
    words = [f"word{i}" for i in range(600)]
    xs = [words, [w.upper() for w in words], words[::-1] + words[:10]]  # 2nd: 600 own ids
    scan = _agrees(_dump(tmp_path, (xs, [1, 2, 3]), protocol))
    assert len(scan.externals(2, 0)) == 600  # sample 2 refers to 600 strings of sample 0


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_appended_samples_with_externals_between_fields(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "f.pkl"
    path.write_bytes(
        b"".join(pickle.dumps((np.ones(3) * i, np.zeros(i)), protocol=protocol) for i in range(4))
    )
    scan = _agrees(path)
    assert scan.records.shape == (4, 3)
    assert (scan.records[1:, 2] > 0).all()  # later pickles' memo keys are shifted
    assert len(scan.externals(3, 1)) > 0  # y refers to x's dtype and globals


def test_a_reused_pickler_that_does_not_refer_back(tmp_path: Path) -> None:
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    for i in range(3):
        p.dump(([f"a{i}", f"b{i}"], [i, i]))  # PUT ids continue from the previous dump
    path = tmp_path / "f.pkl"
    path.write_bytes(buf.getvalue())
    assert _agrees(path).layout == "appended_columns"


def test_the_chosen_engine_runs(tmp_path: Path, engine: str) -> None:
    assert scan_file(_dump(tmp_path, ([1, 2], [3, 4]))).engine == engine
