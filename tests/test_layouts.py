"""Layout recognition: each supported top-level shape becomes columns; anything else is refused."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest

from pickleshard import PickleDataset
from pickleshard.errors import (
    FieldLengthMismatchError,
    NotSpanIndexableError,
    UnsupportedLayoutError,
)
from pickleshard.scan import scan_bytes
from pickleshard.scan.layouts import (
    APPENDED,
    LAYOUT_CHOICE_HELP,
    LAYOUT_CHOICES,
    LAYOUT_TABLE,
    LAYOUTS,
    MAX_LIST_FIELDS,
    LayoutChoice,
    check_layout_choice,
    decode_layout,
    default_field_names,
    layout_named,
)
from pickleshard.scan.records import decode_records
from pickleshard.testing import assert_same

XS = [np.full((2, 2), i, dtype=np.float32) for i in range(4)]
YS = [3, 1, 4, 1]
SAMPLES = list(zip(XS, YS, strict=True))


@pytest.mark.parametrize(
    ("obj", "layout", "fields"),
    [
        ((XS, YS), "columns", ("x", "y")),
        ([XS, YS], "columns", ("x", "y")),
        ((tuple(XS), tuple(YS)), "columns", ("x", "y")),
        ({"image": XS, "label": YS}, "dict_columns", ("image", "label")),
        ([(x, y) for x, y in SAMPLES], "rows", ("x", "y")),
        ([{"image": x, "label": y} for x, y in SAMPLES], "dict_rows", ("image", "label")),
        ((np.stack(XS), np.array(YS)), "columns", ("x", "y")),
    ],
    ids=["tuple", "list", "tuple_of_tuples", "dict", "rows", "dict_rows", "ndarray_fields"],
)
def test_layouts_decode_to_samples(obj: Any, layout: str, fields: tuple[str, ...]) -> None:
    decoded = decode_layout(obj, "f.pkl")
    assert (decoded.layout, decoded.fields, decoded.num_samples) == (layout, fields, 4)
    for i, (x, y) in enumerate(SAMPLES):
        got = tuple(col[i] for col in decoded.columns)
        assert np.array_equal(got[0], x)
        assert got[1] == y


def test_more_than_two_fields_are_named_after_x_and_y() -> None:
    assert default_field_names(4) == ("x", "y", "f2", "f3")
    decoded = decode_layout(([1, 2], ["a", "b"], [0.5, 0.25], [None, None]), "f.pkl")
    assert decoded.fields == ("x", "y", "f2", "f3")
    assert_same(tuple(c[1] for c in decoded.columns), (2, "b", 0.25, None))


def test_zero_sample_columns_are_a_valid_file() -> None:
    decoded = decode_layout(([], []), "f.pkl")
    assert (decoded.layout, decoded.num_samples) == ("columns", 0)


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_list_of_empty_dicts_is_refused_or_read_as_records(protocol: int) -> None:
    """Rows with no fields were read as zero samples (whole-file) after the scanner crashed:
    refused by name with the fix, and ``layout='records'`` reads each dict as one sample."""
    data = pickle.dumps([{}, {}, {}], protocol=protocol)
    with pytest.raises(NotSpanIndexableError, match="an empty dict: a row with no fields"):
        scan_bytes(data, "f.pkl")  # the whole-file load then refuses it, as below
    with pytest.raises(UnsupportedLayoutError, match="a row with no fields"):
        decode_layout(pickle.loads(data), "f.pkl")
    decoded = decode_layout(pickle.loads(data), "f.pkl", choice="records")
    assert decoded.num_samples == 3
    assert [c for col in decoded.columns for c in col] == [{}, {}, {}]


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_dict_rows_with_a_key_the_first_lacks_are_refused_or_read_as_records(
    tmp_path: Path, engine: str
) -> None:
    """``[{"a": 1}, {"a": 2, "b": 3}]`` read ``{"a": 2}`` for the second sample (its ``b``
    dropped, in place and whole): ``auto`` refuses it naming the key, ``layout='records'``
    reads each dict whole, as ``pickle.load`` gives it."""
    rows = [{"a": 1}, {"b": 2, "a": 3}, {"a": 4}]
    with pytest.raises(NotSpanIndexableError, match="different keys \\(extra 'b'\\)"):
        scan_bytes(pickle.dumps(rows, protocol=4), "f.pkl", engine=engine)
    with pytest.raises(UnsupportedLayoutError, match="different keys \\(extra 'b'\\)"):
        decode_layout(rows, "f.pkl")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.pkl").write_bytes(pickle.dumps(rows, protocol=4))
    with pytest.raises(UnsupportedLayoutError, match="layout='records' reads them"):
        PickleDataset(tmp_path / "d")
    ds = PickleDataset(tmp_path / "d", layout="records", rebuild="auto")
    assert [ds[i][0] for i in range(len(ds))] == rows
    assert [type(ds[i][0]) for i in range(len(ds))] == [dict] * 3


def test_a_long_list_of_lists_is_not_read_as_columns() -> None:
    rows = [[i, i + 1] for i in range(MAX_LIST_FIELDS + 1)]
    with pytest.raises(UnsupportedLayoutError, match=r"list of length 65"):
        decode_layout(rows, "f.pkl")


@pytest.mark.parametrize(
    "obj",
    [
        7,
        None,
        "text",
        {"a": 1, "b": 2},
        {},
        [],
        (),
        [1, 2, 3],
        (np.float32(1.0), [1]),
        np.zeros((3, 2)),
        [(1, 2)] * (MAX_LIST_FIELDS + 1) + [(3,)],
        [{"x": 1, "y": 2}, {"x": 3, "z": 4}],
        [{}],
        [{}, {}, {}],
        [{"x": 1}, {"x": 2, "z": 3}],
    ],
    ids=repr,
)
def test_unsupported_top_level_objects_name_the_file(obj: Any) -> None:
    with pytest.raises(UnsupportedLayoutError) as info:
        decode_layout(obj, "/data/odd.pkl")
    assert str(info.value).startswith("/data/odd.pkl")
    assert "expected" in str(info.value)
    assert not isinstance(info.value, FieldLengthMismatchError)


@pytest.mark.parametrize(
    "obj",
    [
        (list(range(5)), list(range(3))),
        [list(range(5)), list(range(3))],
        {"x": list(range(5)), "y": list(range(3))},
        (np.zeros((5, 2)), np.zeros(3)),
    ],
    ids=["tuple", "list", "dict", "ndarray"],
)
def test_field_length_mismatch_names_both_lengths(obj: Any) -> None:
    with pytest.raises(FieldLengthMismatchError) as info:
        decode_layout(obj, "/data/mismatch.pkl")
    message = str(info.value)
    assert message.startswith("/data/mismatch.pkl")
    assert "= 5" in message
    assert "= 3" in message


# Objects that exercise every decision of match_layout, both ways.
_DECISIONS = [
    (XS, YS),
    [XS, YS],
    {"image": XS, "label": YS},
    [(x, y) for x, y in SAMPLES],
    [{"image": x, "label": y} for x, y in SAMPLES],
    [(1, 2), (3,)],  # rows of two lengths: a list of two columns, of two lengths
    [(1, 2), [3, 4]],  # a tuple then a list: two columns
    [{"a": 1}, [1]],  # a dict then a list: refused
    {"a": [1], "b": 2},  # a dict with a value that is no sequence: refused
    ([1], 2),  # a tuple with an item that is no sequence: refused
    [[i] for i in range(MAX_LIST_FIELDS + 1)],  # too many to be columns: refused
    (),
    [],
    {},
    5,
]


@pytest.mark.parametrize("obj", _DECISIONS, ids=[str(i) for i in range(len(_DECISIONS))])
def test_the_scanner_and_decode_layout_take_the_same_decision(obj: Any) -> None:
    """One table, one set of decisions: the scanner (on opcode nodes) names the layout that
    decode_layout (on the unpickled object) names, or both refuse."""
    try:
        want = decode_records([obj], "f.pkl").layout  # one pickle: its file's decision
    except FieldLengthMismatchError:  # a layout of columns, but not of one length
        want = "mismatch"
    except UnsupportedLayoutError:
        want = "refused"
    try:
        got = scan_bytes(pickle.dumps(obj, protocol=4)).layout
    except FieldLengthMismatchError:
        got = "mismatch"
    except NotSpanIndexableError:
        got = "refused"
    assert got == want
    if want in LAYOUT_TABLE:
        assert layout_named(want, "f.pkl") is LAYOUT_TABLE[want]
        assert layout_named(APPENDED + want, "f.pkl") is LAYOUT_TABLE[want]


def test_every_layout_of_the_table_is_reachable() -> None:
    """decode_records names every layout of the table (appended pickles for the per-pickle ones),
    and each name's entry says how its samples sit."""
    seen = {decode_layout(obj, "f.pkl").layout for obj in _DECISIONS[:5]}
    seen.add(decode_records([(1, 2), (3, 4)], "f.pkl").layout.removeprefix(APPENDED))
    seen.add(decode_records([{"a": 1}, {"a": 2}], "f.pkl").layout.removeprefix(APPENDED))
    seen.add(decode_records([[1, "a"]], "f.pkl", "records").layout)  # only when asked for
    assert seen == set(LAYOUT_TABLE)
    assert LAYOUTS == ("columns", "dict_columns", "rows", "dict_rows")
    assert [x.name for x in LAYOUT_TABLE.values() if x.rows] == ["rows", "dict_rows", "items"]
    assert [x.name for x in LAYOUT_TABLE.values() if x.per_pickle] == ["samples", "dict_samples"]
    assert [x.name for x in LAYOUT_TABLE.values() if x.keyed] == [
        "dict_columns",
        "dict_rows",
        "dict_samples",
    ]


def test_an_unknown_layout_name_is_a_clear_error() -> None:
    with pytest.raises(UnsupportedLayoutError, match=r"f\.pkl.*unknown layout 'appended_piles'"):
        layout_named("appended_piles", "f.pkl")


def test_the_layout_table_and_the_choices_are_read_only() -> None:
    """A row added from outside would never be chosen (match_layout decides by name), so the
    table is a read-only view; the choices are the LayoutChoice literal, each described."""
    with pytest.raises(TypeError):
        LAYOUT_TABLE["piles"] = LAYOUT_TABLE["rows"]  # type: ignore[index]
    with pytest.raises(TypeError):
        LAYOUT_CHOICE_HELP["piles"] = "a pile"  # type: ignore[index]
    assert LAYOUT_CHOICES == tuple(LAYOUT_CHOICE_HELP) == get_args(LayoutChoice)
    assert LAYOUT_CHOICES == ("auto", "columns", "records", "file")
    assert all(check_layout_choice(c) == c for c in LAYOUT_CHOICES)
    with pytest.raises(ValueError, match="'auto', 'columns', 'records', 'file'"):
        check_layout_choice("piles")
