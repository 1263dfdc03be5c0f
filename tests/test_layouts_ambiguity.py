"""Layouts the user names (``layout=``), and an inferred layout that is never silently one of two
readings: the producers of issue 14 whose bytes have two legal readings, each read exactly as
``pickle.load`` gives it under the right ``layout=``; the default reads what the producer meant
(issue 27: appended records of small arrays are records, one ``(image, mask)`` per file is one
sample) and warns where both readings stay plausible."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pickleshard import AmbiguousLayoutWarning, PickleDataset, build_index
from pickleshard.cli import main
from pickleshard.errors import IndexFormatError, UnsupportedLayoutError
from pickleshard.inspect.file import inspect_file
from pickleshard.scan import scan_bytes
from pickleshard.scan.records import decode_records
from pickleshard.testing import same


def _records(path: Path) -> list[Any]:
    """Every pickle of ``path``, by ``pickle.load`` alone: the oracle."""
    out = []
    with open(path, "rb") as f:
        while f.peek(1):
            out.append(pickle.load(f))
    return out


def _image_mask(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), rng.random((16, 16)) > 0.5


@pytest.fixture
def appended(tmp_path: Path) -> Path:
    """One file of 12 ``pickle.dump((image, mask), f)`` records."""
    rng = np.random.default_rng(1)
    root = tmp_path / "appended"
    root.mkdir()
    with open(root / "a.pkl", "wb") as f:
        for _ in range(12):
            pickle.dump(_image_mask(rng), f, protocol=4)
    return root


@pytest.fixture
def per_file(tmp_path: Path) -> Path:
    """Four files of one ``(image, mask)`` each."""
    rng = np.random.default_rng(2)
    root = tmp_path / "per_file"
    root.mkdir()
    for i in range(4):
        (root / f"{i}.pkl").write_bytes(pickle.dumps(_image_mask(rng), protocol=5))
    return root


@pytest.fixture
def chunks(tmp_path: Path) -> Path:
    """One file of 12 appended ``(X (8, 4, 4), y (8,))`` chunks: data beside a label column."""
    rng = np.random.default_rng(6)
    root = tmp_path / "chunks"
    root.mkdir()
    with open(root / "c.pkl", "wb") as f:
        for _ in range(12):
            pickle.dump((rng.random((8, 4, 4)), rng.integers(0, 10, 8)), f, protocol=4)
    return root


@pytest.fixture
def transitions(tmp_path: Path) -> Path:
    """One file of 10 appended ``{"obs": (8,), "next_obs": (8,)}`` dicts."""
    rng = np.random.default_rng(3)
    root = tmp_path / "transitions"
    root.mkdir()
    with open(root / "t.pkl", "wb") as f:
        for _ in range(10):
            pickle.dump({"obs": rng.random(8), "next_obs": rng.random(8)}, f)
    return root


def _open(root: Path, **kw: Any) -> tuple[PickleDataset, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = PickleDataset(root, jobs=1, **kw)
    return ds, [w for w in seen if issubclass(w.category, AmbiguousLayoutWarning)]


def test_appended_records_read_as_records_without_a_warning(appended: Path) -> None:
    want = _records(appended / "a.pkl")
    ds, seen = _open(appended)
    assert not seen
    assert len(ds) == 12
    assert ds.file_modes == ("span",)
    assert all(same(ds[i], want[i]) for i in range(12))
    assert all(
        same(s, w)
        for s, w in zip(ds.__getitems__([11, 0, 5]), [want[11], want[0], want[5]], strict=True)
    )
    whole = PickleDataset(appended, jobs=1, mode="whole")
    assert all(same(whole[i], want[i]) for i in range(12))
    ds, seen = _open(appended, layout="columns", rebuild="auto")
    assert not seen
    assert len(ds) == 12 * 16
    assert same(ds[17], (want[1][0][1], want[1][1][1]))


def test_appended_chunks_with_a_label_column_warn_and_read_as_records_when_asked(
    chunks: Path,
) -> None:
    ds, seen = _open(chunks)
    assert len(ds) == 12 * 8  # rows of the arrays: the reading "auto" took
    assert len(seen) == 1
    text = str(seen[0].message)
    assert str(chunks / "c.pkl") in text
    assert "12 appended pickles" in text
    assert "8 samples long" in text
    assert "layout='records'" in text
    assert "layout='columns'" in text
    assert seen[0].filename == __file__  # points at the caller's line
    want = _records(chunks / "c.pkl")
    ds, seen = _open(chunks, layout="records", rebuild="auto")
    assert not seen
    assert len(ds) == 12
    assert all(same(ds[i], want[i]) for i in range(12))


def test_one_sample_per_file_reads_whole_objects_and_warns(per_file: Path) -> None:
    ds, seen = _open(per_file)
    assert len(ds) == 4
    assert ds.file_modes == ("span",) * 4
    for i in range(4):
        assert same(ds[i], pickle.loads((per_file / f"{i}.pkl").read_bytes()))
    assert len(seen) == 1  # once per dataset, however many files
    text = str(seen[0].message)
    assert "one sample per file" in text
    assert "layout='columns'" in text
    assert "3 more file(s)" in text
    ds, seen = _open(per_file, layout="file", rebuild="auto")
    assert not seen
    assert len(ds) == 4
    records, seen = _open(per_file, layout="records", rebuild="auto")  # one pickle: one record
    assert not seen
    assert [same(records[i], ds[i]) for i in range(4)] == [True] * 4
    columns, seen = _open(per_file, layout="columns", rebuild="auto")
    assert not seen
    assert len(columns) == 4 * 16


def test_appended_dicts_read_one_sample_per_dict(transitions: Path) -> None:
    want = _records(transitions / "t.pkl")
    for layout in ("auto", "records"):
        ds, seen = _open(transitions, layout=layout, rebuild="auto")
        assert not seen
        assert len(ds) == 10
        assert ds.fields == ("obs", "next_obs")
        for i in range(10):
            assert type(ds[i]) is dict
            assert list(ds[i]) == ["obs", "next_obs"]
            assert all(same(ds[i][k], want[i][k]) for k in want[i])
    ds, seen = _open(transitions, layout="columns", rebuild="auto")
    assert len(ds) == 80


@pytest.mark.parametrize("chunks", [[40], [25, 25, 25, 9], [100, 100]])
def test_the_seed_layout_never_warns(tmp_path: Path, chunks: list[int]) -> None:
    """``(x_list, y_list)`` of any size, one pickle or appended chunks of many samples (the
    last shorter or not), and ``(X, y)`` arrays of many samples: one reading only."""
    rng = np.random.default_rng(4)
    with open(tmp_path / "seed.pkl", "wb") as f:
        for n in chunks:
            xs = [rng.random((3, 4)).astype(np.float32) for _ in range(n)]
            pickle.dump((xs, rng.integers(0, 10, n).tolist()), f)
    (tmp_path / "arrays.pkl").write_bytes(
        pickle.dumps((rng.random((100, 3, 4)), np.arange(100)), protocol=5)
    )
    (tmp_path / "tiny.pkl").write_bytes(pickle.dumps(([np.zeros(3)] * 3, [1, 2, 3])))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = PickleDataset(tmp_path, jobs=1)
    assert len(ds) == sum(chunks) + 100 + 3


def _appended_bytes(objs: list[Any]) -> bytes:
    return b"".join(pickle.dumps(o, protocol=4) for o in objs)


_RNG = np.random.default_rng(5)
_PRODUCERS = {
    "appended": [_image_mask(_RNG) for _ in range(5)],
    "per_file": [_image_mask(_RNG)],
    "transitions": [{"obs": _RNG.random(8), "next_obs": _RNG.random(8)} for _ in range(3)],
    "list_columns": [([1, 2], [3, 4]) for _ in range(3)],  # small chunks of lists: columns
    "label_chunks": [(np.zeros((4, 2, 2)), np.arange(4)) for _ in range(3)],
    "labelled": [(np.zeros((5, 2, 2)), np.arange(5))],  # (X, y): y is a label column
    "wide_rows": [[tuple(range(100)), tuple(range(100, 200))]],  # two tuples of 100
    "seed": [([np.zeros(2)] * 5, [1, 2, 3, 4, 5])],
}


@pytest.mark.parametrize("name", list(_PRODUCERS))
def test_the_scanner_and_the_whole_file_load_flag_the_same_files(name: str) -> None:
    objs = _PRODUCERS[name]
    scanned = scan_bytes(_appended_bytes(objs)).ambiguity
    decoded = decode_records(objs, "f.pkl").ambiguity
    plain = name in ("seed", "list_columns", "labelled", "appended", "transitions")
    assert (scanned is None) == (decoded is None) == plain
    if scanned is not None and decoded is not None:
        assert (scanned.argument, scanned.keep) == (decoded.argument, decoded.keep)


def test_rows_that_may_be_columns_read_as_columns_when_asked(tmp_path: Path) -> None:
    obj = [tuple(range(100)), tuple(range(100, 200))]
    (tmp_path / "w.pkl").write_bytes(pickle.dumps(obj))
    ds, seen = _open(tmp_path)
    assert len(ds) == 2
    assert len(seen) == 1
    assert "layout='columns'" in str(seen[0].message)
    ds, seen = _open(tmp_path, layout="columns", rebuild="auto")
    assert not seen
    assert len(ds) == 100
    assert ds[7] == (7, 107)


def test_records_reads_the_items_of_a_top_level_list(tmp_path: Path) -> None:
    """A list of images (not tuples): with layout="records" each item is one sample (field x);
    auto reads it as columns or refuses it."""
    images = [np.full((4, 5), i, np.uint8) for i in range(70)]
    (tmp_path / "imgs.pkl").write_bytes(pickle.dumps(images, protocol=4))
    with pytest.raises(UnsupportedLayoutError):
        PickleDataset(tmp_path, jobs=1)
    ds, seen = _open(tmp_path, layout="records", rebuild="auto")
    assert not seen
    assert ds.fields == ("x",)
    assert len(ds) == 70
    assert ds.file_modes == ("span",)
    assert all(same(ds[i], (images[i],)) for i in (0, 33, 69))
    whole = PickleDataset(tmp_path, jobs=1, layout="records", mode="whole")
    assert same(whole[33], (images[33],))


def test_file_layout_refuses_a_file_of_several_pickles(appended: Path) -> None:
    with pytest.raises(UnsupportedLayoutError, match="layout='records' reads one sample per"):
        PickleDataset(appended, jobs=1, layout="file")


def test_an_index_built_with_one_layout_is_stale_for_another(chunks: Path) -> None:
    idx = build_index(chunks, jobs=1, layout="records")
    assert idx.header["layout_choice"] == "records"
    assert idx.num_samples == 12
    assert idx.files[0].ambiguity is None
    with pytest.raises(IndexFormatError, match="built with layout='records'"):
        PickleDataset(chunks, jobs=1, rebuild="never")
    ds, _ = _open(chunks)  # rebuild="missing" rebuilds it: another reading is another index
    assert len(ds) == 12 * 8
    assert ds.index.header["layout_choice"] == "auto"
    assert ds.index.files[0].ambiguity is not None
    with pytest.raises(ValueError, match="layout must be one of"):
        PickleDataset(chunks, jobs=1, layout="rows")  # type: ignore[arg-type]


def test_an_edited_ambiguity_in_the_index_is_refused(chunks: Path) -> None:
    idx = build_index(chunks, jobs=1)
    header = json.loads((idx.path / "index.json").read_text())
    header["files"][0]["ambiguity"]["argument"] = "everything"
    (idx.path / "index.json").write_text(json.dumps(header))
    with pytest.raises(IndexFormatError, match="ambiguity names an unknown layout"):
        PickleDataset(chunks, jobs=1, rebuild="never")


def test_inspect_shows_the_reading_and_the_alternative(
    chunks: Path, per_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = inspect_file(chunks / "c.pkl")
    assert report.layout == "appended_columns"
    assert report.ambiguity is not None
    assert report.ambiguity.argument == "records"
    assert report.to_json()["ambiguity"]["alternative"] == "12 records, one sample per pickle"
    assert inspect_file(chunks / "c.pkl", layout="records").ambiguity is None
    assert inspect_file(chunks / "c.pkl", layout="records").samples == 12
    assert main(["inspect", str(per_file / "0.pkl")]) == 0
    out = capsys.readouterr().out
    assert "layout   file (the file's one pickle is the sample)" in out
    assert "chosen   one sample per file (the whole object) (--layout file)" in out
    assert (
        "or       columns of numpy arrays, 16 samples (one row of each) (--layout columns)" in out
    )
    assert main(["inspect", "--layout", "file", str(per_file / "0.pkl")]) == 0
    out = capsys.readouterr().out
    assert "layout   file (the file's one pickle is the sample)" in out
    assert "chosen" not in out


def test_inspect_of_a_file_read_whole_shows_the_alternative(tmp_path: Path) -> None:
    """Protocol 1 is not read in place: the whole-file reading decides and flags as the scanner
    does."""
    path = tmp_path / "p1.pkl"
    path.write_bytes(pickle.dumps(_image_mask(np.random.default_rng(7)), protocol=1))
    report = inspect_file(path)
    assert not report.span_indexable
    assert report.ambiguity is not None
    assert report.ambiguity.argument == "columns"
    ds, seen = _open(tmp_path)
    assert len(seen) == 1
    assert ds.file_modes == ("whole",)
    assert len(ds) == 1
    assert same(ds[0], pickle.loads(path.read_bytes()))
    ds, seen = _open(tmp_path, layout="columns", rebuild="auto")
    want = pickle.loads(path.read_bytes())
    assert not seen
    assert len(ds) == 16
    assert same(ds[3], (want[0][3], want[1][3]))


def test_cli_index_and_convert_take_the_layout(appended: Path, tmp_path: Path) -> None:
    assert main(["index", str(appended), "--layout", "records", "--jobs", "1"]) == 0
    out = tmp_path / "out"
    assert main(["convert", str(appended), str(out), "--layout", "records", "--jobs", "1"]) == 0
    assert main(["verify", str(appended), str(out), "--layout", "records"]) == 0
    from pickleshard import open_dataset

    conv = open_dataset(out)
    want = _records(appended / "a.pkl")
    assert len(conv) == 12
    assert all(same(tuple(conv[i]), want[i]) for i in range(12))
