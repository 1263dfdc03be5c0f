"""A tampered or damaged index: every kind ends in IndexFormatError naming the index file, or in
correct data after ``rebuild="auto"`` (issue 12, item 2).

An index shipped with a downloaded dataset is as untrusted as the data. Each case edits the
files in ``.pickleshard/`` as an attacker would, and then (where the edit is to an array)
recomputes that array's checksum in the header, so that the content checks, not the checksum,
must catch it; :func:`test_accidental_corruption_is_caught_by_the_checksum` covers the checksum.
The cases that crashed the interpreter before (an ``object`` dtype read from raw bytes) run in a
subprocess, so a regression fails its test instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import oracle_samples
from pickleshard import errors
from pickleshard.cli import main
from pickleshard.dataset import PickleDataset
from pickleshard.index import FORMAT_VERSION, DatasetIndex, contents
from pickleshard.indexing.build import build_index
from pickleshard.indexing.opening import open_index
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing import assert_same

Edit = Callable[[Path], Any]
MODES = ("auto", "span", "whole")


# -- tampering tools -------------------------------------------------------------------------


def _header(index_dir: Path) -> dict[str, Any]:
    return json.loads((index_dir / "index.json").read_text())


def _write_header(index_dir: Path, header: dict[str, Any]) -> None:
    (index_dir / "index.json").write_text(json.dumps(header))


def edit_header(change: Callable[[dict[str, Any]], Any]) -> Edit:
    def edit(index_dir: Path) -> None:
        header = _header(index_dir)
        change(header)
        _write_header(index_dir, header)

    return edit


def edit_scan(change: Callable[[dict[str, Any]], Any], file: int = 0) -> Edit:
    return edit_header(lambda h: change(h["files"][file]["scan"]))


def _save_array(index_dir: Path, name: str, array: np.ndarray) -> None:
    """Replace array ``name`` (an attacker's save: the header's checksum follows)."""
    header = _header(index_dir)
    path = index_dir / header["arrays"][name]
    with open(path, "wb") as fh:
        np.save(fh, array, allow_pickle=True)
    header["checksums"][name] = f"crc32:{zlib.crc32(path.read_bytes()):08x}"
    _write_header(index_dir, header)


def edit_array(name: str, change: Callable[[np.ndarray], Any]) -> Edit:
    def edit(index_dir: Path) -> None:
        path = index_dir / _header(index_dir)["arrays"][name]
        array = np.load(path).copy()
        got = change(array)
        _save_array(index_dir, name, array if got is None else got)

    return edit


def _swap_rows(a: np.ndarray, i: int = 1, j: int = 2) -> None:
    a[[i, j]] = a[[j, i]]


def _swap_span_rows(index_dir: Path) -> None:
    """Swap two samples in every span array (starts, ends, memo base): a consistent swap."""
    for name in ("starts", "ends", "memo_base"):
        edit_array(name, _swap_rows)(index_dir)


def _move_counts(index_dir: Path) -> None:
    """Move one sample from file 1 to file 0 in the files table, and fix everything the files
    table alone decides (rows, samples array, checksums): the spans no longer fit."""
    header = _header(index_dir)
    files = header["files"]
    files[0]["num_samples"] += 1
    files[1]["num_samples"] -= 1
    files[1]["span_row"] += 1
    files[1]["ext_row"] += len(header["fields"])
    _write_header(index_dir, header)
    counts = [f["num_samples"] for f in files]
    samples = np.empty(sum(counts), [("file", "<u4"), ("item", "<u4")])
    samples["file"] = np.repeat(np.arange(len(counts)), counts)
    samples["item"] = np.concatenate([np.arange(n) for n in counts])
    _save_array(index_dir, "samples", samples)


def _repeat_externals(index_dir: Path, times: int) -> None:
    """Give sample 1's first field one valid external ``times`` over (offsets moved along)."""
    header = _header(index_dir)
    off = np.load(index_dir / header["arrays"]["ext_offsets"])
    keys = np.load(index_dir / header["arrays"]["ext_keys"])
    nf = len(header["fields"])
    k = 1 * nf  # span (1, 0)
    lo, hi = int(off[k]), int(off[k + 1])
    assert hi > lo
    keys = np.concatenate([keys[:hi], np.repeat(keys[lo], times), keys[hi:]])
    off = np.where(np.arange(len(off)) > k, off + times, off)
    _save_array(index_dir, "ext_keys", keys)
    _save_array(index_dir, "ext_offsets", off)


def _arrays_dataset(folder: Path) -> Path:
    """Three files of (x: float32 (2, 3) arrays read from their payloads, y: small ints)."""
    write_synthetic(folder, files=3, per_file=6, shape=(2, 3))
    return folder


def _objects_dataset(folder: Path) -> Path:
    """Spans that need externals (a shared table): dicts with repeated keys."""
    write_synthetic(folder, files=2, per_file=6, kind="objects")
    return folder


def _rows_dataset(folder: Path) -> Path:
    """array_row fields: each field one ndarray, every sample a row of it."""
    folder.mkdir(parents=True)
    for k in range(2):
        xs = np.arange(36, dtype=np.float32).reshape(6, 2, 3) + k
        with open(folder / f"rows-{k}.pkl", "wb") as fh:
            pickle.dump((xs, np.arange(6, dtype=np.int64) * (k + 1)), fh, protocol=4)
    return folder


def _unlike_dataset(folder: Path) -> Path:
    """Two files whose shared tables differ (one more shared dict key in the second)."""
    folder.mkdir(parents=True)
    for k in range(2):
        extra = {"z": -1} if k else {}
        xs = [{**extra, "a": i, "b": [i, "t"]} for i in range(6)]
        with open(folder / f"unlike-{k}.pkl", "wb") as fh:
            pickle.dump((xs, list(range(6))), fh, protocol=4)
    return folder


DATASETS = {
    "arrays": _arrays_dataset,
    "objects": _objects_dataset,
    "rows": _rows_dataset,
    "unlike": _unlike_dataset,
}


def _expected(folder: Path) -> list[tuple[Any, ...]]:
    return [s for p in sorted(folder.glob("*.pkl")) for s in oracle_samples(p)]


def _assert_reads_like_pickle(ds: PickleDataset, folder: Path) -> None:
    want = _expected(folder)
    assert len(ds) == len(want)
    for i, sample in enumerate(want):
        assert_same(ds[i], sample)
    assert_same(list(ds.__getitems__(list(range(len(want)))[::-1])), want[::-1])


# -- the corpus: (dataset, edit, what the message says) --------------------------------------

_O = "|O"
CASES: dict[str, tuple[str, Edit, str]] = {
    # item descriptors in index.json
    "item_dtype_object": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(descr=_O)),
        "holds Python objects",
    ),
    "item_dtype_struct_with_object": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(descr=[["a", "<f4"], ["b", _O]])),
        "holds Python objects",
    ),
    "item_dtype_garbage": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(descr=[["a", ["b", ["c", 5]]]])),
        "descr",
    ),
    "item_shape_huge": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(shape=[1 << 20, 1 << 20])),
        "its dtype and shape read 4398046511104",
    ),
    "item_shape_negative": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(shape=[-2, -3])),
        "shape[0] is -2",
    ),
    "item_shape_bigger_itemsize": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(descr="<f8")),
        "its dtype and shape read 48",
    ),
    "item_prefix_past_payload": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(prefix=400)),
        "do not fit its prefix 400",
    ),
    "item_exceptions_out_of_range": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(exceptions=[0, 99])),
        "exceptions",
    ),
    "item_every_sample_an_exception": (
        "arrays",
        edit_scan(lambda s: s["items"][0].update(exceptions=list(range(6)))),
        "every sample",
    ),
    "int_item_on_an_array_field": (
        "arrays",
        edit_scan(lambda s: s["items"].__setitem__(0, {"kind": "int"})),
        "is not one small int",
    ),
    "array_row_dtype_object": (
        "rows",
        edit_scan(lambda s: s["arrays"][0].update(descr=_O)),
        "holds Python objects",
    ),
    "array_row_shape_huge": (
        "rows",
        edit_scan(lambda s: s["arrays"][0].update(row_shape=[1 << 30, 1 << 30])),
        "array row",
    ),
    "kind_unknown": ("arrays", edit_scan(lambda s: s["kinds"].__setitem__(0, "raw")), "kinds"),
    "protocol_out_of_range": ("arrays", edit_scan(lambda s: s.update(protocol=300)), "protocol"),
    "scan_size_differs": ("arrays", edit_scan(lambda s: s.update(size=10**12)), "size"),
    # files table and header
    "counts_moved_in_header_only": (
        "arrays",
        edit_header(
            lambda h: (
                h["files"][0].update(num_samples=7),
                h["files"][1].update(num_samples=5),
            )
        ),
        "rows",
    ),
    "counts_moved_with_rows_fixed": ("arrays", _move_counts, "rows out of order"),
    "num_samples_string": (
        "arrays",
        edit_header(lambda h: h["files"][0].update(num_samples="6")),
        "num_samples is '6'",
    ),
    "num_samples_total_wrong": ("arrays", edit_header(lambda h: h.update(num_samples=17)), "17"),
    "span_row_negative": (
        "arrays",
        edit_header(lambda h: h["files"][1].update(span_row=-6)),
        "span_row",
    ),
    "path_escapes_dataset": (
        "arrays",
        edit_header(lambda h: h["files"][0].update(path="../outside.pkl")),
        "inside the dataset",
    ),
    "path_absolute": (
        "arrays",
        edit_header(lambda h: h["files"][0].update(path="/etc/passwd")),
        "inside the dataset",
    ),
    "path_twice": (
        "arrays",
        edit_header(lambda h: h["files"][1].update(path=h["files"][0]["path"])),
        "twice",
    ),
    "array_name_escapes_index": (
        "arrays",
        edit_header(lambda h: h["arrays"].update(starts="../../starts.npy")),
        "not a file of the index",
    ),
    "ctime_and_inode_stripped": (
        "arrays",
        edit_header(lambda h: [(r.pop("ctime_ns"), r.pop("ino")) for r in h["files"]]),
        "lacks ['ctime_ns', 'ino']",
    ),
    "mode_unknown": ("arrays", edit_header(lambda h: h["files"][0].update(mode="mmap")), "mode"),
    "fields_renamed": ("arrays", edit_header(lambda h: h.update(fields=["x", "z"])), "fields"),
    "files_not_a_list": ("arrays", edit_header(lambda h: h.update(files={"a": 1})), "files"),
    "skipped_path_escapes": (
        "arrays",
        edit_header(
            lambda h: h.update(
                skipped=[
                    {"path": "../x.pkl", "error": "E", "message": "m", "size": 1, "mtime_ns": 1}
                ]
            )
        ),
        "inside the dataset",
    ),
    "checksum_missing": ("arrays", edit_header(lambda h: h.pop("checksums")), "checksums"),
    "json_nested_deeply": (
        "arrays",
        lambda d: (d / "index.json").write_text("[" * 100_000 + "]" * 100_000),
        "nested too deeply",
    ),
    "json_not_an_object": ("arrays", lambda d: (d / "index.json").write_text("[1, 2]"), "object"),
    # shared table (externals)
    "shared_key_outside_its_element": (
        "objects",
        edit_scan(lambda s: s["shared"]["keys"].__setitem__(-1, 10**9)),
        "not defined in element",
    ),
    "shared_element_refers_to_itself": (
        "objects",
        edit_scan(lambda s: s["shared"]["elements"][0].__setitem__(3, [5])),
        "externals",
    ),
    # span arrays
    "starts_dtype_object": ("arrays", edit_array("starts", lambda a: a.astype(object)), "object"),
    "starts_float64": ("arrays", edit_array("starts", lambda a: a.astype(np.float64)), "float64"),
    "starts_nan": (
        "arrays",
        edit_array("starts", lambda a: np.where(a == a.max(), np.nan, a.astype(np.float64))),
        "float64",
    ),
    "starts_int32": ("arrays", edit_array("starts", lambda a: a.astype(np.int32)), "int32"),
    "starts_big_endian": ("arrays", edit_array("starts", lambda a: a.astype(">i8")), ">i8"),
    "starts_fortran_order": (
        "arrays",
        edit_array("starts", lambda a: np.asfortranarray(a)),
        "Fortran",
    ),
    "starts_wrong_shape": ("arrays", edit_array("starts", lambda a: a[:-1]), "shape"),
    "starts_extra_column": (
        "arrays",
        edit_array("starts", lambda a: np.concatenate([a, a[:, :1]], axis=1)),
        "shape",
    ),
    "start_negative": ("arrays", edit_array("starts", lambda a: a.__setitem__((3, 0), -5)), "-5"),
    "end_past_the_file": (
        "arrays",
        edit_array("ends", lambda a: a.__setitem__((5, 0), 1 << 40)),  # file 0's last sample
        "outside the file's pickles",
    ),
    "end_before_start": (
        "arrays",
        edit_array("ends", lambda a: a.__setitem__((3, 1), a[3, 1] - 9)),
        "ends before it starts",
    ),
    "span_rows_swapped": ("arrays", _swap_span_rows, "out of order"),
    "span_starts_swapped_between_fields": (
        "objects",
        edit_array("starts", lambda a: a.__setitem__(slice(None), a[:, ::-1])),
        "ends before it starts",
    ),
    "memo_base_huge": (
        "objects",
        edit_array("memo_base", lambda a: a.__setitem__((2, 0), 1 << 40)),
        "memo base",
    ),
    "memo_base_negative": (
        "objects",
        edit_array("memo_base", lambda a: a.__setitem__((2, 0), -(1 << 40))),
        "memo base",
    ),
    "record_shift_huge": (
        "objects",
        edit_array("records", lambda a: a.__setitem__((0, 2), 1 << 40)),
        "pickle",
    ),
    "record_outside_the_file": (
        "objects",
        edit_array("records", lambda a: a.__setitem__((0, 1), 1 << 40)),
        "pickle",
    ),
    "ext_offsets_past_keys": (
        "objects",
        edit_array("ext_offsets", lambda a: a.__setitem__(-1, 1 << 40)),
        "offsets",
    ),
    "ext_offsets_decreasing": (
        "objects",
        edit_array("ext_offsets", lambda a: a.__setitem__(3, a[3] + 50)),
        "offsets",
    ),
    "ext_keys_repeated": (
        "objects",
        lambda d: _repeat_externals(d, 50),
        "more externals than",
    ),
    "ext_key_huge": (
        "objects",
        edit_array("ext_keys", lambda a: a.__setitem__(0, 1 << 40)),
        "external",
    ),
    "ext_key_not_shared": (
        "objects",
        edit_array("ext_keys", lambda a: a.__setitem__(0, 0)),
        "shared table",
    ),
    "samples_rows_swapped": ("arrays", edit_array("samples", _swap_rows), "samples-"),
    "samples_file_out_of_range": (
        "arrays",
        edit_array("samples", lambda a: a["file"].__setitem__(0, 1 << 30)),
        "is (1073741824, 0), expected (0, 0)",
    ),
    "array_row_length_wrong": (
        "rows",
        edit_array("ends", lambda a: a.__setitem__((2, 0), a[2, 0] - 4)),
        "is not one 24-byte array row",
    ),
    # the array files themselves
    "npy_truncated": (
        "arrays",
        lambda d: _truncate(d / _header(d)["arrays"]["ends"]),
        "truncated",
    ),
    "npy_not_an_npy": (
        "arrays",
        lambda d: (d / _header(d)["arrays"]["ends"]).write_bytes(pickle.dumps([1, 2])),
        "not a .npy",
    ),
    "npy_missing": ("arrays", lambda d: (d / _header(d)["arrays"]["ends"]).unlink(), "ends-"),
    "npy_is_a_fifo": ("arrays", lambda d: _fifo(d / _header(d)["arrays"]["ends"]), "regular"),
    "index_json_is_a_fifo": ("arrays", lambda d: _fifo(d / "index.json"), "regular"),
}


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 8])


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _build(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    folder = DATASETS[kind](tmp_path / "data")
    return folder, build_index(folder, jobs=1).path


@pytest.mark.parametrize("case", sorted(CASES))
def test_tampered_index_is_refused_by_name(tmp_path: Path, case: str) -> None:
    kind, edit, what = CASES[case]
    folder, index_dir = _build(tmp_path, kind)
    edit(index_dir)
    with pytest.raises(errors.IndexFormatError) as info:
        DatasetIndex.open(index_dir)
    message = str(info.value)
    assert str(index_dir) in message
    assert what in message
    for mode in MODES:  # every entry point refuses it the same way
        with pytest.raises(errors.IndexFormatError, match="rebuild"):
            PickleDataset(folder, mode=mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", sorted(CASES))
def test_rebuild_auto_rebuilds_a_tampered_index(tmp_path: Path, case: str) -> None:
    kind, edit, _ = CASES[case]
    folder, index_dir = _build(tmp_path, kind)
    edit(index_dir)
    for mode in MODES:
        ds = PickleDataset(folder, rebuild="auto", mode=mode)  # type: ignore[arg-type]
        _assert_reads_like_pickle(ds, folder)
    DatasetIndex.open(index_dir)  # the rebuilt index is whole again


def test_accidental_corruption_is_caught_by_the_checksum(tmp_path: Path) -> None:
    """A flipped bit that every content check accepts (the memo base of sample 0's int field,
    23 -> 22, still in range and in order): only the checksum sees it, and names the file."""
    _, index_dir = _build(tmp_path, "objects")
    header = _header(index_dir)
    name = header["arrays"]["memo_base"]
    path = index_dir / name
    memo = np.load(path)
    assert memo[0, 1] == 23
    data = bytearray(path.read_bytes())
    data[len(data) - memo.nbytes + 8] ^= 1  # row 0, field 1
    path.write_bytes(bytes(data))
    with pytest.raises(errors.IndexFormatError, match=rf"{name}: checksum .* corrupted"):
        DatasetIndex.open(index_dir)
    header["checksums"]["memo_base"] = f"crc32:{zlib.crc32(bytes(data)):08x}"
    _write_header(index_dir, header)
    assert DatasetIndex.open(index_dir).spans["memo_base"][0, 1] == 22  # nothing else sees it


def test_a_rebuild_deletes_no_file_an_edited_header_names(tmp_path: Path) -> None:
    """A rebuild deletes the arrays the old header names: never a path outside the index."""
    folder, index_dir = _build(tmp_path, "arrays")
    victim = tmp_path / "victim.npy"
    victim.write_bytes(b"keep me")
    edit_header(lambda h: h["arrays"].update(samples="../../victim.npy"))(index_dir)
    assert main(["index", str(folder), "--jobs", "1", "--json"]) == 0
    assert victim.read_bytes() == b"keep me"
    PickleDataset(folder, rebuild="auto")
    assert victim.read_bytes() == b"keep me"
    _assert_reads_like_pickle(PickleDataset(folder, rebuild="never"), folder)


def test_index_command_rebuilds_over_a_tampered_index(tmp_path: Path) -> None:
    folder, index_dir = _build(tmp_path, "arrays")
    edit_array("starts", lambda a: a.astype(np.float64))(index_dir)
    assert main(["index", str(folder), "--jobs", "1", "--json"]) == 0
    _assert_reads_like_pickle(PickleDataset(folder, rebuild="never"), folder)


def test_verify_against_a_source_with_a_tampered_index_rebuilds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``verify SRC OUT`` opens the source with ``rebuild="auto"``: the tampered index is
    rebuilt, and the comparison is against the real samples."""
    folder, index_dir = _build(tmp_path, "arrays")
    out = tmp_path / "out"
    assert main(["convert", str(folder), str(out), "--to", "memmap"]) == 0
    _swap_span_rows(index_dir)
    with pytest.raises(errors.IndexFormatError, match="out of order"):
        DatasetIndex.open(index_dir)
    capsys.readouterr()
    assert main(["verify", str(folder), str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["checked"], report["against"]) == (18, "source")
    DatasetIndex.open(index_dir)


def test_index_only_shape_permutation_reads_correct_data(tmp_path: Path) -> None:
    """An item shape permuted with the same byte count, in the index alone: the payload check
    against one real unpickling refuses the payload reads, so every sample reads by span."""
    folder, index_dir = _build(tmp_path, "arrays")
    edit_scan(lambda s: s["items"][0].update(shape=[3, 2]))(index_dir)
    DatasetIndex.open(index_dir)  # nothing in the index alone says this shape is wrong
    _assert_reads_like_pickle(PickleDataset(folder, mode="span"), folder)


def test_whole_file_count_moved_is_refused_on_read(tmp_path: Path) -> None:
    """Files read whole: the index alone cannot tell a moved count, the load can."""
    folder = _arrays_dataset(tmp_path / "data")
    index_dir = build_index(folder, jobs=1, spans=False).path
    _move_counts_whole(index_dir)
    ds = PickleDataset(folder, mode="whole")
    with pytest.raises(
        errors.IndexFormatError, match=r"records 7 samples.*part-00000\.pkl holds 6"
    ):
        ds[0]
    with pytest.raises(errors.IndexFormatError, match=r"index\.json"):
        ds.__getitems__([17, 3])


def _move_counts_whole(index_dir: Path) -> None:
    header = _header(index_dir)
    header["files"][0]["num_samples"] += 1
    header["files"][1]["num_samples"] -= 1
    _write_header(index_dir, header)
    counts = [f["num_samples"] for f in header["files"]]
    samples = np.empty(sum(counts), [("file", "<u4"), ("item", "<u4")])
    samples["file"] = np.repeat(np.arange(len(counts)), counts)
    samples["item"] = np.concatenate([np.arange(n) for n in counts])
    _save_array(index_dir, "samples", samples)


def test_an_older_index_is_rebuilt_by_default(tmp_path: Path) -> None:
    """Version 2 had no checksums: it counts as missing (rebuilt), or is refused by name."""
    folder, index_dir = _build(tmp_path, "arrays")
    edit_header(lambda h: (h.update(version=2), h.pop("checksums")))(index_dir)
    with pytest.raises(errors.IndexFormatError, match="older pickleshard"):
        open_index(folder, rebuild="never")
    opened, _ = open_index(folder)
    assert opened.header["version"] == FORMAT_VERSION
    _assert_reads_like_pickle(PickleDataset(folder), folder)


# -- the cases that crashed the interpreter, each in its own process ---------------------------

_CHILD = """
import sys
from pickleshard import errors
from pickleshard.dataset import PickleDataset
try:
    ds = PickleDataset(sys.argv[1], mode=sys.argv[2])
    ds[3]
except errors.IndexFormatError as exc:
    print("IndexFormatError:", exc)
"""


@pytest.mark.parametrize("case", ["item_dtype_object", "array_row_dtype_object", "starts_nan"])
@pytest.mark.parametrize("mode", MODES)
def test_former_crashes_end_in_an_error_in_a_child_process(
    tmp_path: Path, case: str, mode: str
) -> None:
    kind, edit, what = CASES[case]
    folder, index_dir = _build(tmp_path, kind)
    edit(index_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder), mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, f"child died with {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.startswith("IndexFormatError:")
    assert str(index_dir) in done.stdout
    assert what in done.stdout


@pytest.mark.parametrize("kind", ["arrays", "unlike"])  # every file's table alike; not
@pytest.mark.parametrize("lookup", [1 << 24, 0], ids=["lookup_table", "binary_search"])
def test_externals_outside_the_shared_table_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lookup: int, kind: str
) -> None:
    """Membership in the shared table is checked with a lookup table, or (key ranges too
    wide for one) a binary search: both accept a good index and refuse a key outside."""
    monkeypatch.setattr(contents, "_LOOKUP", lookup)
    _, index_dir = _build(tmp_path, kind)
    DatasetIndex.open(index_dir)
    tables = [f["scan"]["shared"]["keys"] for f in _header(index_dir)["files"]]
    assert (tables[0] == tables[-1]) == (kind == "arrays")
    assert all(tables)
    keys = np.load(index_dir / _header(index_dir)["arrays"]["ext_keys"])
    edit_array("ext_keys", lambda a: a.__setitem__(len(a) - 1, a[-1] - 1))(index_dir)
    assert keys[-1] - 1 not in tables[-1]
    with pytest.raises(errors.IndexFormatError, match=rf"key {len(keys) - 1} .* shared table"):
        DatasetIndex.open(index_dir)


# -- edits the index alone cannot reveal: never a crash, never wrong data ----------------------

SUBTLE: dict[str, tuple[str, Edit]] = {
    # memo bases one higher for file 0's x spans: in range, in order, externals still below
    "memo_base_plus_one": (
        "objects",
        edit_array("memo_base", lambda a: a.__setitem__((slice(0, 6), 0), a[0:6, 0] + 1)),
    ),
    # file 0's memo shift lowered (>= -size): GETs and PUTs renumbered wrongly
    "record_shift_minus_one": (
        "objects",
        edit_array("records", lambda a: a.__setitem__((0, 2), a[0, 2] - 1)),
    ),
    "record_shift_minus_hundred": (
        "unlike",
        edit_array("records", lambda a: a.__setitem__((0, 2), a[0, 2] - 100)),
    ),
    # an item's shape permuted (same bytes): caught by the check against one real unpickling
    "item_shape_permuted": ("arrays", edit_scan(lambda s: s["items"][0].update(shape=[3, 2]))),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(SUBTLE))
def test_edits_that_pass_the_checks_give_an_error_or_the_right_samples(
    tmp_path: Path, case: str, mode: str
) -> None:
    kind, edit = SUBTLE[case]
    folder, index_dir = _build(tmp_path, kind)
    edit(index_dir)
    DatasetIndex.open(index_dir)  # nothing in the index alone says it is wrong
    want = _expected(folder)
    ds = PickleDataset(folder, mode=mode)  # type: ignore[arg-type]
    for i, sample in enumerate(want):
        try:
            got = ds[i]
        except errors.PickleshardError as exc:
            message = str(exc)
        else:
            assert_same(got, sample)
            continue
        assert str(folder) in message


# -- an item's framing template (head and tail bytes around the payload) ------------------------


def _with_template(index_dir: Path, folder: Path) -> dict[str, Any]:
    """Give file 0's array item the framing template the scanner records (the bytes of its
    first direct sample before and after the payload), as the read-time framing check uses."""
    header = _header(index_dir)
    item = header["files"][0]["scan"]["items"][0]
    starts = np.load(index_dir / header["arrays"]["starts"])
    ends = np.load(index_dir / header["arrays"]["ends"])
    t = next(i for i in range(6) if i not in item["exceptions"])
    data = (folder / header["files"][0]["path"]).read_bytes()
    start, end, prefix = int(starts[t, 0]), int(ends[t, 0]), item["prefix"]
    nbytes = int(np.prod(item["shape"])) * np.dtype(item["descr"]).itemsize
    item.update(
        head=data[start : start + prefix].hex(),
        tail=data[start + prefix + nbytes : end].hex(),
        head_masked=[],
        tail_masked=[],
        bounds=[0],
    )
    _write_header(index_dir, header)
    return header


TEMPLATE_CASES: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "payload_longer": (lambda it: it.update(descr="<f8"), "declares a payload of [24] bytes"),
    "head_not_hex": (lambda it: it.update(head="zz"), "not hex"),
    "head_not_the_prefix": (lambda it: it.update(head=it["head"][:-2]), "do not fit"),
    "tail_shorter": (lambda it: it.update(tail=it["tail"][:-2]), "bytes long like"),
    "mask_outside": (lambda it: it.update(tail_masked=[[0, 999]]), "tail_masked end"),
    "bound_outside": (lambda it: it.update(bounds=[999]), "bounds"),
}


@pytest.mark.parametrize(
    "change", [{"shape": [3, 2]}, {"descr": "<f2", "shape": [2, 6]}], ids=["shape", "dtype_shape"]
)
def test_a_dtype_or_shape_edit_the_template_cannot_see_reads_correct_data(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    """Same payload bytes, other dtype or shape, template as recorded: the index alone cannot
    tell (the template's ints and tuples may be encoded any way a pickler likes); the reader's
    check of one sample against a real unpickling refuses the payload reads, so every sample
    reads by span, equal to pickle.load."""
    folder, index_dir = _build(tmp_path, "arrays")
    header = _with_template(index_dir, folder)
    header["files"][0]["scan"]["items"][0].update(change)
    _write_header(index_dir, header)
    DatasetIndex.open(index_dir)
    _assert_reads_like_pickle(PickleDataset(folder, mode="span"), folder)


@pytest.mark.parametrize("case", sorted(TEMPLATE_CASES))
def test_an_items_template_must_match_its_dtype_shape_and_spans(tmp_path: Path, case: str) -> None:
    folder, index_dir = _build(tmp_path, "arrays")
    header = _with_template(index_dir, folder)
    DatasetIndex.open(index_dir)  # the template as recorded: accepted
    change, what = TEMPLATE_CASES[case]
    change(header["files"][0]["scan"]["items"][0])
    _write_header(index_dir, header)
    with pytest.raises(errors.IndexFormatError, match=re.escape(what)) as info:
        DatasetIndex.open(index_dir)
    assert str(index_dir) in str(info.value)
