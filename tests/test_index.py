"""The dataset index: build, reopen by mmap, header contents, sources, staleness, bad files.

The content oracle lives here too: for every layout and protocol, ``ds[i]`` equals what
``pickle.load`` of the file holds at that position.
"""

from __future__ import annotations

import json
import os
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import (
    BAD_FILES,
    LAYOUT_CASES,
    WritePickle,
    oracle_samples,
    outcome_without_privileges,
)
from pickleshard import __version__, errors
from pickleshard.dataset import PickleDataset
from pickleshard.index import DatasetIndex, fingerprint
from pickleshard.indexing.build import build_index
from pickleshard.indexing.opening import open_index
from pickleshard.io import ByteSource, LocalFile
from pickleshard.io.identity import FileIdentity
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing import assert_same
from rewrites import rewrite_keeping_size_and_mtime


def _synth(folder: Path, **kwargs: Any) -> list[Path]:
    options: dict[str, Any] = {"files": 3, "per_file": 5, "shape": (2, 3)}
    options.update(kwargs)
    return write_synthetic(folder, **options)


def _names(index: DatasetIndex) -> list[str]:
    return [f.path for f in index.files]


# -- build and reopen ------------------------------------------------------------------------


def test_build_then_reopen_memory_maps_the_arrays(tmp_path: Path) -> None:
    _synth(tmp_path / "data", per_file=4)
    built = build_index(tmp_path / "data", jobs=1)
    assert built.path == tmp_path / "data" / ".pickleshard"
    assert (built.path / "index.json").is_file()
    reopened = DatasetIndex.open(built.path)
    assert isinstance(reopened.samples, np.memmap)
    assert not reopened.samples.flags.writeable
    assert len(reopened) == reopened.num_samples == 12
    assert np.array_equal(reopened.samples, built.samples)
    assert reopened.file_starts.tolist() == [0, 4, 8, 12]
    assert reopened.locate(0) == (0, 0)
    assert reopened.locate(5) == (1, 1)
    assert reopened.locate(11) == (2, 3)
    assert reopened.fields == ("x", "y")


def test_header_records_format_version_and_files_table(tmp_path: Path) -> None:
    paths = _synth(tmp_path / "data", per_file=4)
    index = build_index(tmp_path / "data", jobs=1)
    header = json.loads((index.path / "index.json").read_text())
    assert header["format"] == "pickleshard-index"
    assert header["version"] == 5
    assert header["sample_form"] == "tuple"
    assert header["tool_version"] == __version__
    for name, file in header["arrays"].items():  # each array's checksum, as index.py reads it
        data = (index.path / file).read_bytes()
        assert header["checksums"][name] == f"crc32:{zlib.crc32(data):08x}"
    assert header["layout"] == ["columns"]
    assert header["fields"] == ["x", "y"]
    assert (header["num_files"], header["num_samples"]) == (3, 12)
    assert (index.path / header["arrays"]["samples"]).is_file()
    assert [f["path"] for f in header["files"]] == [p.name for p in paths]
    for entry, path in zip(header["files"], paths, strict=True):
        st = path.stat()
        assert entry["size"] == st.st_size
        assert entry["mtime_ns"] == st.st_mtime_ns
        assert entry["fingerprint"] == fingerprint(path)
        assert len(entry["fingerprint"]) == 32
        assert entry["num_samples"] == 4
        assert entry["decoded_nbytes"] >= 4 * 2 * 3 * 4  # four float32 (2, 3) arrays at least
        assert (entry["layout"], entry["fields"]) == ("columns", ["x", "y"])


def test_index_pickles_by_path_and_reopens(tmp_path: Path) -> None:
    _synth(tmp_path / "data")
    index = build_index(tmp_path / "data", jobs=1)
    data = pickle.dumps(index)
    assert len(data) < 2000  # the path, not the arrays
    back = pickle.loads(data)
    assert isinstance(back.samples, np.memmap)
    assert back.path == index.path
    assert np.array_equal(back.samples, index.samples)


def test_rebuild_replaces_the_arrays(tmp_path: Path) -> None:
    _synth(tmp_path / "data")
    first = build_index(tmp_path / "data", jobs=1)
    first_arrays = sorted(p.name for p in first.path.glob("samples-*.npy"))
    second = build_index(tmp_path / "data", jobs=1)
    second_arrays = sorted(p.name for p in second.path.glob("samples-*.npy"))
    assert len(first_arrays) == len(second_arrays) == 1
    assert first_arrays != second_arrays
    assert np.array_equal(second.samples, first.samples)


def test_progress_bar_counts_every_file_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _synth(tmp_path / "data", files=3, per_file=4)
    quiet = build_index(tmp_path / "data", index=tmp_path / "quiet", jobs=1)
    assert "index" not in capsys.readouterr().err  # no bar unless asked
    shown = build_index(tmp_path / "data", index=tmp_path / "shown", jobs=1, progress=True)
    assert "3/3" in capsys.readouterr().err
    assert shown.files == quiet.files
    assert np.array_equal(shown.samples, quiet.samples)


def test_parallel_build_equals_serial_build(tmp_path: Path) -> None:
    _synth(tmp_path / "data", files=5, per_file=7)
    serial = build_index(tmp_path / "data", index=tmp_path / "serial", jobs=1)
    parallel = build_index(tmp_path / "data", index=tmp_path / "parallel", jobs=2)
    assert parallel.files == serial.files
    assert np.array_equal(parallel.samples, serial.samples)
    assert parallel.file_starts.tolist() == serial.file_starts.tolist()
    drop = {"arrays"}
    assert {k: v for k, v in parallel.header.items() if k not in drop} == {
        k: v for k, v in serial.header.items() if k not in drop
    }


def test_zero_sample_files_take_no_rows(write_pickle: WritePickle) -> None:
    write_pickle("a.pkl", ([1, 2, 3], [0, 0, 0]))
    write_pickle("b.pkl", ([], []))
    write_pickle("c.pkl", ([4, 5], [1, 1]))
    index = build_index(write_pickle("d.pkl", ([], [])).parent, jobs=1)
    assert [f.num_samples for f in index.files] == [3, 0, 2, 0]
    assert index.file_starts.tolist() == [0, 3, 3, 5, 5]
    assert [index.locate(i) for i in range(5)] == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1)]


def test_a_dataset_of_only_empty_files_has_no_samples(write_pickle: WritePickle) -> None:
    folder = write_pickle("a.pkl", ([], [])).parent
    index = build_index(folder, jobs=1)
    assert len(index) == 0
    assert len(DatasetIndex.open(index.path).samples) == 0


# -- sources -----------------------------------------------------------------------------------


def test_directory_source_is_recursive_and_picks_pickle_extensions(
    write_pickle: WritePickle,
) -> None:
    for name in ("a.pkl", "sub/b.pickle", "sub/deeper/c.pk", "d.p"):
        write_pickle(name, ([1], [2]))
    root = write_pickle("a.pkl", ([1], [2])).parent
    (root / "notes.txt").write_text("not data")
    (root / "arr.npy").write_bytes(b"\x93NUMPY")
    (root / "dir.pkl").mkdir()  # a directory with a pickle name is not a file
    (root / ".pickleshard").mkdir()
    (root / ".pickleshard" / "stray.pkl").write_bytes(b"not indexed")
    index = build_index(root, jobs=1)
    assert _names(index) == ["a.pkl", "d.p", "sub/b.pickle", "sub/deeper/c.pk"]


def test_glob_source(tmp_path: Path) -> None:
    _synth(tmp_path / "data", files=4)
    index = build_index(str(tmp_path / "data" / "part-0000[13].pkl"), jobs=1)
    assert _names(index) == ["part-00001.pkl", "part-00003.pkl"]
    assert index.path.parent == tmp_path / "data" / ".pickleshard"
    assert index.path.name.startswith("files-")
    recursive = build_index(str(tmp_path / "**" / "*.pkl"), jobs=1)
    assert _names(recursive) == [f"part-{i:05d}.pkl" for i in range(4)]


def test_list_of_files_source_gets_its_own_index(tmp_path: Path) -> None:
    paths = _synth(tmp_path / "data", files=4)
    first = build_index([paths[2], paths[0]], jobs=1)
    second = build_index(paths[1:3], jobs=1)
    assert _names(first) == ["part-00000.pkl", "part-00002.pkl"]
    assert _names(second) == ["part-00001.pkl", "part-00002.pkl"]
    assert first.path != second.path
    assert DatasetIndex.open(first.path).files == first.files


def test_explicit_index_directory(tmp_path: Path) -> None:
    _synth(tmp_path / "data")
    index = build_index(tmp_path / "data", index=tmp_path / "elsewhere", jobs=1)
    assert index.path == tmp_path / "elsewhere"
    assert not (tmp_path / "data" / ".pickleshard").exists()
    opened, _ = open_index(tmp_path / "data", index=tmp_path / "elsewhere", rebuild="never")
    assert opened.files == index.files


# -- sources that are not there ------------------------------------------------------------------


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(errors.DatasetNotFoundError) as info:
        build_index(tmp_path / "nope", jobs=1)
    assert str(tmp_path / "nope") in str(info.value)


def test_directory_without_pickle_files(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "readme.txt").write_text("hello")
    with pytest.raises(errors.NoPickleFilesError) as info:
        build_index(tmp_path / "data", jobs=1)
    assert str(tmp_path / "data") in str(info.value)
    assert "*.pkl" in str(info.value)


def test_glob_without_matches(tmp_path: Path) -> None:
    pattern = str(tmp_path / "*.pkl")
    with pytest.raises(errors.NoPickleFilesError) as info:
        build_index(pattern, jobs=1)
    assert pattern in str(info.value)


def test_file_list_naming_a_missing_file(tmp_path: Path) -> None:
    good = _synth(tmp_path / "data", files=1)[0]
    with pytest.raises(errors.DatasetNotFoundError) as info:
        build_index([good, tmp_path / "data" / "gone.pkl"], jobs=1)
    assert str(tmp_path / "data" / "gone.pkl") in str(info.value)
    with pytest.raises(errors.NoPickleFilesError):
        build_index([], jobs=1)


# -- bad files -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_build_index_rejects_bad_file(tmp_path: Path, data: bytes, expected: str) -> None:
    _synth(tmp_path / "data", files=2)
    bad = tmp_path / "data" / "bad.pkl"
    bad.write_bytes(data)
    with pytest.raises(getattr(errors, expected)) as info:
        build_index(tmp_path / "data", jobs=1)
    assert str(bad.resolve()) in str(info.value)
    assert not (tmp_path / "data" / ".pickleshard" / "index.json").exists()


def _bad_objects() -> dict[str, tuple[Any, str]]:
    cases = dict(LAYOUT_CASES)
    cases["length_mismatch"] = (([1, 2, 3], [0, 1]), "FieldLengthMismatchError")
    return cases


@pytest.mark.parametrize(("obj", "expected"), _bad_objects().values(), ids=_bad_objects())
def test_build_index_rejects_unsupported_layout(
    write_pickle: WritePickle, obj: Any, expected: str
) -> None:
    write_pickle("a-good.pkl", ([1, 2], [3, 4]))
    bad = write_pickle("b-bad.pkl", obj)
    with pytest.raises(getattr(errors, expected)) as info:
        build_index(bad.parent, jobs=1)
    assert str(bad.resolve()) in str(info.value)
    if expected == "FieldLengthMismatchError":
        assert "= 3" in str(info.value)
        assert "= 2" in str(info.value)


_PARALLEL_CASES = {
    "empty": (b"", "EmptyPickleError"),
    "text": (b"just some text\n", "NotAPickleError"),
    "truncated": (pickle.dumps(([1.0] * 50, [1] * 50), protocol=5)[:60], "TruncatedPickleError"),
    "int": (pickle.dumps(42), "UnsupportedLayoutError"),
    "mismatch": (pickle.dumps(([1, 2, 3], [1, 2])), "FieldLengthMismatchError"),
}


@pytest.mark.parametrize(("data", "expected"), _PARALLEL_CASES.values(), ids=_PARALLEL_CASES)
def test_parallel_build_raises_the_workers_error(
    tmp_path: Path, data: bytes, expected: str
) -> None:
    _synth(tmp_path / "data", files=3)
    bad = tmp_path / "data" / "part-00001.pkl"
    bad.write_bytes(data)
    with pytest.raises(getattr(errors, expected)) as info:
        build_index(tmp_path / "data", jobs=2)
    assert str(bad.resolve()) in str(info.value)
    assert info.value.path == str(bad.resolve())


def test_files_with_different_fields_are_refused(write_pickle: WritePickle) -> None:
    write_pickle("a.pkl", ([1, 2], [3, 4]))
    other = write_pickle("b.pkl", {"image": [1, 2], "label": [3, 4]})
    with pytest.raises(errors.UnsupportedLayoutError) as info:
        build_index(other.parent, jobs=1)
    assert str(other.resolve()) in str(info.value)


def test_directory_in_a_file_list_is_unreadable(tmp_path: Path, unreadable_dir_pkl: Path) -> None:
    good = _synth(tmp_path / "data", files=1)[0]
    with pytest.raises(errors.UnreadableFileError) as info:
        build_index([good, unreadable_dir_pkl], jobs=1)
    assert str(unreadable_dir_pkl.resolve()) in str(info.value)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="drops privileges in a forked child")
def test_file_without_read_permission_is_unreadable(tmp_path: Path, locked_file: Path) -> None:
    err = outcome_without_privileges(
        lambda: build_index(locked_file.parent, index=tmp_path / "never-written", jobs=1)
    )
    assert isinstance(err, errors.UnreadableFileError)
    assert str(locked_file.resolve()) in str(err)
    assert "Permission denied" in str(err)


def test_dangling_symlink_is_unreadable_and_named(tmp_path: Path, dangling_link: Path) -> None:
    write_synthetic(dangling_link.parent, files=1, per_file=2, shape=(1,))
    with pytest.raises(errors.UnreadableFileError) as info:
        build_index(dangling_link.parent, jobs=1)
    assert str(dangling_link.parent.resolve() / "broken.pkl") in str(info.value)


def test_symlinked_file_keeps_its_own_name(tmp_path: Path) -> None:
    target = _synth(tmp_path / "elsewhere", files=1)[0]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "linked.pkl").symlink_to(target)
    index = build_index(tmp_path / "data", jobs=1)
    assert _names(index) == ["linked.pkl"]


# -- staleness -------------------------------------------------------------------------------------


def test_fresh_index_opens_without_rebuilding(tmp_path: Path) -> None:
    _synth(tmp_path / "data")
    built = build_index(tmp_path / "data", jobs=1)
    opened, source = open_index(tmp_path / "data", rebuild="never")
    assert opened.header["arrays"] == built.header["arrays"]
    assert source.files == tuple(_names(built))


def test_same_size_rewrite_with_restored_mtime_is_caught_by_the_fingerprint(tmp_path: Path) -> None:
    paths = _synth(tmp_path / "data")
    index = build_index(tmp_path / "data", jobs=1)
    rewrite_keeping_size_and_mtime(paths[1], offset=paths[1].stat().st_size // 2)
    entry = index.files[1]
    assert (paths[1].stat().st_size, paths[1].stat().st_mtime_ns) == (entry.size, entry.mtime_ns)
    with pytest.raises(errors.StaleIndexError) as info:
        open_index(tmp_path / "data")
    assert info.value.changed == ("part-00001.pkl",)
    assert (info.value.removed, info.value.added) == ((), ())
    assert "part-00001.pkl" in str(info.value)


def test_fingerprint_of_a_large_file_samples_its_blocks(tmp_path: Path) -> None:
    paths = _synth(tmp_path / "data", files=2, per_file=40, shape=(16, 16))
    assert paths[0].stat().st_size > 8 * 4096
    build_index(tmp_path / "data", jobs=1)
    rewrite_keeping_size_and_mtime(paths[0], offset=100)
    with pytest.raises(errors.StaleIndexError) as info:
        open_index(tmp_path / "data")
    assert info.value.changed == ("part-00000.pkl",)


class _MemorySource(ByteSource):
    """Bytes in memory as a byte source, counting the ranges read."""

    protocol = "memory"

    def __init__(self, data: bytes) -> None:
        self.name, self.data, self.reads = "<memory>", data, 0

    @property
    def size(self) -> int:
        return len(self.data)

    def readinto_at(self, offset: int, view: memoryview) -> int:
        chunk = self.data[offset : offset + len(view)]
        view[: len(chunk)] = chunk
        self.reads += len(chunk)
        return len(chunk)

    def identity(self) -> FileIdentity:
        return FileIdentity(len(self.data))

    def close(self) -> None:
        pass


@pytest.mark.parametrize("size", [0, 100, 8 * 4096, 8 * 4096 + 1, 3_000_000])
def test_fingerprint_reads_through_any_byte_source(tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "f.pkl"
    path.write_bytes(data)
    source = _MemorySource(data)
    assert fingerprint(source) == fingerprint(path) == fingerprint(LocalFile(path))
    assert source.reads == min(size, 8 * 4096)  # the size and 8 blocks, whatever the size
    other = bytearray(data)
    if size:
        other[0] ^= 1  # the first block is always sampled
        assert fingerprint(_MemorySource(bytes(other))) != fingerprint(path)


def test_removed_and_added_files_are_named(tmp_path: Path) -> None:
    paths = _synth(tmp_path / "data", files=3)
    build_index(tmp_path / "data", jobs=1)
    paths[0].unlink()
    _synth(tmp_path / "data", files=1, prefix="new")
    paths[2].write_bytes(paths[2].read_bytes() + b"")  # same bytes: mtime moves, content does not
    os.utime(paths[1], ns=(0, 1))  # mtime changed, content the same: still reported
    with pytest.raises(errors.StaleIndexError) as info:
        open_index(tmp_path / "data")
    err = info.value
    assert err.removed == ("part-00000.pkl",)
    assert err.added == ("new-00000.pkl",)
    assert "part-00001.pkl" in err.changed
    for name in ("part-00000.pkl", "new-00000.pkl", "part-00001.pkl"):
        assert name in str(err)
    assert str(tmp_path / "data" / ".pickleshard") in str(err)


def test_rebuild_auto_rebuilds_a_stale_index(tmp_path: Path) -> None:
    paths = _synth(tmp_path / "data", files=2, per_file=3)
    build_index(tmp_path / "data", jobs=1)
    with open(paths[0], "wb") as fh:
        pickle.dump(([np.zeros(2)] * 5, [7] * 5), fh)
    with pytest.raises(errors.StaleIndexError):
        open_index(tmp_path / "data")
    index, _ = open_index(tmp_path / "data", rebuild="auto")
    assert [f.num_samples for f in index.files] == [5, 3]
    opened, _ = open_index(tmp_path / "data", rebuild="never")  # now fresh
    assert opened.header["arrays"] == index.header["arrays"]


def test_rebuild_never_does_not_build_or_rebuild(tmp_path: Path) -> None:
    paths = _synth(tmp_path / "data")
    with pytest.raises(errors.IndexFormatError) as info:
        open_index(tmp_path / "data", rebuild="never")
    assert str(tmp_path / "data" / ".pickleshard") in str(info.value)
    assert not (tmp_path / "data" / ".pickleshard" / "index.json").exists()
    build_index(tmp_path / "data", jobs=1)
    paths[0].unlink()
    with pytest.raises(errors.StaleIndexError):
        open_index(tmp_path / "data", rebuild="never")
    with pytest.raises(ValueError, match="rebuild"):
        open_index(tmp_path / "data", rebuild="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: (d / "index.json").write_text("{not json"),
        lambda d: (d / "index.json").write_text(json.dumps({"format": "other", "version": 1})),
        lambda d: (d / "index.json").write_text(
            json.dumps({**json.loads((d / "index.json").read_text()), "version": 99})
        ),
        lambda d: [p.unlink() for p in d.glob("samples-*.npy")],
        lambda d: (d / "index.json").write_text(
            json.dumps({**json.loads((d / "index.json").read_text()), "num_samples": 1})
        ),
    ],
    ids=["not_json", "other_format", "future_version", "arrays_missing", "count_mismatch"],
)
def test_damaged_index_is_an_index_format_error(
    tmp_path: Path, damage: Callable[[Path], Any]
) -> None:
    _synth(tmp_path / "data")
    index = build_index(tmp_path / "data", jobs=1)
    damage(index.path)
    with pytest.raises(errors.IndexFormatError) as info:
        DatasetIndex.open(index.path)
    assert str(index.path) in str(info.value)


# -- content oracle: ds[i] == pickle.load(file) element-wise -----------------------------------------


LAYOUT_WRITERS: dict[str, Callable[[list[Any], list[Any]], Any]] = {
    "columns_tuple": lambda xs, ys: (xs, ys),
    "columns_list": lambda xs, ys: [xs, ys],
    "dict_columns": lambda xs, ys: {"image": xs, "label": ys},
    "rows": lambda xs, ys: list(zip(xs, ys, strict=True)),
    "dict_rows": lambda xs, ys: [{"image": x, "label": y} for x, y in zip(xs, ys, strict=True)],
    "ndarray_fields": lambda xs, ys: (np.stack(xs), np.asarray(ys, dtype=np.int64)),
    "four_fields": lambda xs, ys: (xs, ys, [f"s{y}" for y in ys], [float(y) / 3 for y in ys]),
    "mixed_objects": lambda xs, ys: (
        [{"a": x.tolist(), "b": (y, None)} for x, y in zip(xs, ys, strict=True)],
        [np.int32(y) for y in ys],
    ),
}


def _assert_dataset_matches_oracle(ds: PickleDataset, files: list[Path]) -> None:
    expected = [s for path in files for s in oracle_samples(path)]
    assert len(ds) == len(expected)
    for i, want in enumerate(expected):
        assert_same(ds[i], want)
    batch = ds.__getitems__(list(range(len(ds)))[::-1])
    for got, want in zip(batch, expected[::-1], strict=True):
        assert_same(got, want)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("layout", LAYOUT_WRITERS)
def test_every_sample_equals_pickle_load(tmp_path: Path, layout: str, protocol: int) -> None:
    rng = np.random.default_rng([protocol, len(layout)])
    files = []
    for k, n in enumerate((4, 7, 2)):
        xs = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(n)]
        ys = rng.integers(0, 10, size=n).tolist()
        path = tmp_path / "data" / f"f{k}.pkl"
        path.parent.mkdir(exist_ok=True)
        with open(path, "wb") as fh:
            pickle.dump(LAYOUT_WRITERS[layout](xs, ys), fh, protocol=protocol)
        files.append(path)
    _assert_dataset_matches_oracle(PickleDataset(tmp_path / "data", jobs=1), files)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("kind", ["arrays", "objects"])
def test_synthetic_datasets_equal_pickle_load(tmp_path: Path, kind: Any, protocol: int) -> None:
    files = write_synthetic(
        tmp_path / "data",
        files=3,
        per_file=6,
        shape=(3, 2),
        kind=kind,
        protocol=protocol,
        seed=protocol,
    )
    _assert_dataset_matches_oracle(PickleDataset(tmp_path / "data", jobs=1), files)


# -- skip_bad: every good file indexed, every bad one listed with its error --------------------


def _folder_with_bad_files(tmp_path: Path) -> Path:
    paths = _synth(tmp_path / "data", files=3, per_file=4)
    data = paths[0].read_bytes()
    (tmp_path / "data" / "a-truncated.pkl").write_bytes(data[: len(data) // 2])
    (tmp_path / "data" / "notes.pkl").write_text("not a pickle\n")
    with open(tmp_path / "data" / "z-fields.pkl", "wb") as fh:
        pickle.dump({"image": [1, 2], "label": [3, 4]}, fh)
    return tmp_path / "data"


@pytest.mark.parametrize("jobs", [1, 2])
def test_skip_bad_indexes_good_files_and_lists_each_bad_one(tmp_path: Path, jobs: int) -> None:
    folder = _folder_with_bad_files(tmp_path)
    with pytest.raises(errors.TruncatedPickleError, match="a-truncated"):
        build_index(folder, jobs=1)
    index = build_index(folder, jobs=jobs, skip_bad=True)
    assert _names(index) == [f"part-0000{i}.pkl" for i in range(3)]
    assert len(index) == 12
    errors_by_path = {s["path"]: s["error"] for s in index.skipped}
    assert errors_by_path == {
        "a-truncated.pkl": "TruncatedPickleError",
        "notes.pkl": "NotAPickleError",
        "z-fields.pkl": "UnsupportedLayoutError",
    }
    for s in index.skipped:
        assert str((folder / s["path"]).resolve()) in s["message"]
    reopened, _ = open_index(folder, rebuild="never")  # skipped files are not "added" files
    assert reopened.skipped == index.skipped
    (folder / "notes.pkl").write_text("still not a pickle, but changed\n")
    with pytest.raises(errors.StaleIndexError) as info:
        open_index(folder)
    assert info.value.changed == ("notes.pkl",)


def test_skip_bad_keeps_the_fields_most_files_have(write_pickle: WritePickle) -> None:
    write_pickle("a.pkl", {"image": [1], "label": [2]})
    for name in ("b.pkl", "c.pkl"):
        write_pickle(name, ([1, 2], [3, 4]))
    index = build_index(write_pickle("d.pkl", ([5], [6])).parent, jobs=1, skip_bad=True)
    assert _names(index) == ["b.pkl", "c.pkl", "d.pkl"]
    assert [s["path"] for s in index.skipped] == ["a.pkl"]


def test_index_command_skip_bad_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pickleshard.cli import main

    folder = _folder_with_bad_files(tmp_path)
    assert main(["index", str(folder), "--jobs", "1"]) == 1  # stops at the first bad file
    assert "a-truncated.pkl" in capsys.readouterr().err
    assert main(["index", str(folder), "--skip-bad", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["files"], summary["samples"], summary["span_files"]) == (3, 12, 3)
    assert [s["path"] for s in summary["skipped"]] == [
        "a-truncated.pkl",
        "notes.pkl",
        "z-fields.pkl",
    ]
    assert all(str(folder.resolve()) in s["message"] for s in summary["skipped"])
    assert main(["index", str(folder), "--skip-bad"]) == 0
    text = capsys.readouterr().out
    assert "skipped 3 bad file(s)" in text
    assert "NotAPickleError" in text
    assert "notes.pkl" in text


def test_index_records_span_and_whole_files(tmp_path: Path) -> None:
    _synth(tmp_path / "data", files=2, per_file=4)
    _synth(tmp_path / "data", files=1, per_file=3, protocol=1, prefix="old")
    index = build_index(tmp_path / "data", jobs=1)
    header = json.loads((index.path / "index.json").read_text())
    assert header["modes"] == {"span": 2, "whole": 1}
    old, a, b = index.files
    assert (old.mode, old.scan, old.span_row) == ("whole", None, -1)
    assert "protocol 0 or 1" in (old.reason or "")
    assert (a.mode, a.reason, a.span_row, b.span_row) == ("span", None, 0, 4)
    assert a.scan is not None
    assert a.scan["layout"] == "columns"
    for name in ("starts", "ends", "memo_base", "ext_offsets", "ext_keys", "records"):
        assert isinstance(index.spans[name], np.memmap)
        assert (index.path / header["arrays"][name]).is_file()
    assert index.spans["starts"].shape == (8, 2)
    scan = index.scan(1, tmp_path / "data" / a.path)
    assert scan.num_samples == 4
    with pytest.raises(errors.NotSpanIndexableError, match="protocol 0 or 1"):
        index.scan(0, tmp_path / "data" / old.path)
