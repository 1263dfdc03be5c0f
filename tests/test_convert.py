"""convert: the plan, crashes at every stage then resume, refusals, locking, bounded memory."""

from __future__ import annotations

import fcntl
import itertools
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pickleshard.dataset import PickleDataset
from pickleshard.errors import (
    ConversionStateError,
    OutputExistsError,
    UnencodableValueError,
    UnsafePickleError,
)
from pickleshard.formats import FORMAT_NAMES, get_format
from pickleshard.formats.arrayrecord import ArrayRecordPartWriter
from pickleshard.formats.arrow.write import TablePartWriter
from pickleshard.formats.base import PartWriter
from pickleshard.formats.files import NpyWriter
from pickleshard.formats.lmdb import LmdbPartWriter
from pickleshard.formats.memmap import MemmapPartWriter
from pickleshard.formats.staging import Staging
from pickleshard.formats.webdataset import WebDatasetPartWriter
from pickleshard.pipelines.convert.run import convert, plan_parts
from pickleshard.testing import SLOW_GLOBAL, SlowInt, assert_same, oracle_samples, write_files
from pickleshard.testing.formats import WritesUnpicklable, tree_bytes

WRITERS: dict[str, type[PartWriter]] = {
    "memmap": MemmapPartWriter,
    "lmdb": LmdbPartWriter,
    "webdataset": WebDatasetPartWriter,
    "parquet": TablePartWriter,
    "arrow": TablePartWriter,
    "lance": TablePartWriter,
    "arrayrecord": ArrayRecordPartWriter,
}
# what two runs of one conversion agree on: every file's bytes, but Lance's own files (random
# names, times in the manifest, metadata maps in hash order) compare by their rows and schema
_LANCE_OWN = ("_versions", "_transactions", "data")


def _contents(to: str, out: Path) -> Any:
    if to != "lance":
        return tree_bytes(out)
    import lance

    ours = {k: v for k, v in tree_bytes(out).items() if k.split("/")[0] not in _LANCE_OWN}
    table = lance.dataset(str(out)).to_table()
    return ours, table, [table.schema.metadata, *[f.metadata for f in table.schema]]


class Crash(Exception):
    """Stands in for a kill at a chosen point."""


def _source(tmp_path: Path, files: int = 4, per_file: int = 5) -> Path:
    rng = np.random.default_rng(0)
    objects = [
        ([rng.standard_normal((2, 3)).astype(np.float32) for _ in range(per_file)],
         list(range(f * per_file, (f + 1) * per_file)))
        for f in range(files)
    ]  # fmt: skip
    write_files(tmp_path / "src", objects)
    return tmp_path / "src"


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 10_000)), max_size=200))
def test_plan_covers_every_file_and_sample_once_in_order(files: list[tuple[int, int]]) -> None:
    counts = [c for c, _ in files]
    sizes = [s for _, s in files]
    parts = plan_parts(counts, sizes)
    assert [p.id for p in parts] == list(range(len(parts)))
    assert sum(p.count for p in parts) == sum(counts)
    if files:
        assert parts[0].first_file == 0
        assert parts[-1].end_file == len(files)
        assert len(parts) <= min(len(files), 64 + sum(s * 64 >= sum(sizes) for s in sizes))
    for a, b in itertools.pairwise(parts):
        assert (a.end_file, a.stop) == (b.first_file, b.start)


def test_a_big_file_is_a_part_of_its_own() -> None:
    parts = plan_parts([10, 10, 10, 10], [1, 1000, 1, 1], max_parts=4)
    assert [(p.first_file, p.end_file) for p in parts] == [(0, 2), (2, 4)]


@pytest.mark.parametrize("to", FORMAT_NAMES)
def test_crash_inside_finalize_then_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    src = _source(tmp_path)
    convert(src, tmp_path / "reference", to=to, jobs=2, shard_bytes=2048)
    cls = type(get_format(to))
    real = cls.finalize

    def finalize_then_crash(self: Any, *args: Any) -> Any:
        real(self, *args)  # every final file written, parts possibly consumed
        raise Crash

    monkeypatch.setattr(cls, "finalize", finalize_then_crash)
    with pytest.raises(Crash):
        convert(src, tmp_path / "out", to=to, jobs=2, shard_bytes=2048)
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(cls, "finalize", real)
    report = convert(src, tmp_path / "out", to=to, jobs=2, shard_bytes=2048)
    assert report.parts_reused == report.parts
    assert _contents(to, tmp_path / "out") == _contents(to, tmp_path / "reference")


@pytest.mark.parametrize("to", FORMAT_NAMES)
def test_crash_halfway_through_a_final_file_then_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    src = _source(tmp_path)
    convert(src, tmp_path / "reference", to=to, jobs=2, shard_bytes=2048)

    def killed_before_rename(self: NpyWriter) -> None:
        self.fh.close()  # the temporary file stays behind, as after a SIGKILL
        raise Crash

    monkeypatch.setattr(NpyWriter, "close", killed_before_rename)
    with pytest.raises(Crash):
        convert(src, tmp_path / "out", to=to, jobs=2, shard_bytes=2048)
    leftovers = [p for p in (tmp_path / ".out.partial").iterdir() if ".tmp-" in p.name]
    assert leftovers
    for p in leftovers:  # as a killed process (another pid) would have left them
        p.rename(p.with_name(p.name.replace(f".tmp-{os.getpid()}", ".tmp-999999")))
    monkeypatch.undo()
    convert(src, tmp_path / "out", to=to, jobs=2, shard_bytes=2048)
    assert _contents(to, tmp_path / "out") == _contents(to, tmp_path / "reference")


@pytest.mark.parametrize("to", FORMAT_NAMES)
def test_crash_while_writing_a_part_then_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    src = _source(tmp_path)
    convert(src, tmp_path / "reference", to=to, jobs=1)
    writer_cls = WRITERS[to]
    real = writer_cls.write
    seen: list[int] = []

    def write_then_crash(self: Any, index: int, sample: Any) -> None:
        seen.append(index)
        if index == 12:
            raise Crash
        real(self, index, sample)

    monkeypatch.setattr(writer_cls, "write", write_then_crash)
    with pytest.raises(Crash):
        convert(src, tmp_path / "out", to=to, jobs=1)
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(writer_cls, "write", real)
    report = convert(src, tmp_path / "out", to=to, jobs=1)
    assert report.parts_reused == 2  # files 0 and 1 (samples 0-9) were finished
    assert _contents(to, tmp_path / "out") == _contents(to, tmp_path / "reference")


def test_crash_before_publishing_then_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _source(tmp_path)
    convert(src, tmp_path / "reference")

    def crash(self: Staging) -> None:
        raise Crash

    real = Staging.publish
    monkeypatch.setattr(Staging, "publish", crash)
    with pytest.raises(Crash):
        convert(src, tmp_path / "out")
    monkeypatch.setattr(Staging, "publish", real)
    report = convert(src, tmp_path / "out")
    assert report.parts_reused == report.parts
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "reference")


def test_a_partial_run_of_a_changed_source_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _source(tmp_path)
    monkeypatch.setattr(Staging, "publish", lambda self: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        convert(src, tmp_path / "out")
    monkeypatch.undo()
    write_files(src, [([1], [2])])  # part-000.pkl now holds other samples
    report = convert(src, tmp_path / "out")
    assert (report.num_samples, report.parts_reused) == (16, 0)
    convert(src, tmp_path / "reference")
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "reference")


def test_a_locked_staging_directory_is_refused(tmp_path: Path) -> None:
    src = _source(tmp_path)
    staging = tmp_path / ".out.partial"
    staging.mkdir()
    fd = os.open(staging / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(ConversionStateError, match="another conversion"):
            convert(src, tmp_path / "out")
    finally:
        os.close(fd)


def test_overwrite_never_deletes_a_directory_that_is_not_a_conversion(tmp_path: Path) -> None:
    src = _source(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(OutputExistsError):
        convert(src, tmp_path / "out", overwrite=True)
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputExistsError, match="not a directory"):
        convert(src, tmp_path / "file")


def test_an_empty_existing_directory_is_used(tmp_path: Path) -> None:
    src = _source(tmp_path)
    (tmp_path / "out").mkdir()
    assert convert(src, tmp_path / "out").num_samples == 20


def test_converts_a_pickle_dataset_with_its_own_policy(tmp_path: Path) -> None:
    paths = write_files(tmp_path / "src", [([1, 2], [SlowInt(3, 0.0), 4])])
    with pytest.raises(UnsafePickleError):
        convert(tmp_path / "src", tmp_path / "refused")
    ds = PickleDataset(tmp_path / "src", allow_globals=[SLOW_GLOBAL])
    report = convert(ds, tmp_path / "out", verify=True, progress=True)
    assert report.verified == 2
    from pickleshard.formats import open_dataset

    out = open_dataset(tmp_path / "out")
    for i, sample in enumerate(oracle_samples(paths)):
        assert_same(out[i], sample)


def test_samples_that_are_not_tuples_of_the_fields_are_refused(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([1, 2], [3, 4])])
    ds = PickleDataset(tmp_path / "src", transform=lambda s: s[0])
    with pytest.raises(UnencodableValueError, match="expected a tuple of 2 fields"):
        convert(ds, tmp_path / "out")


def test_bad_arguments(tmp_path: Path) -> None:
    src = _source(tmp_path)
    with pytest.raises(ValueError, match="unknown format"):
        convert(src, tmp_path / "out", to="feather")
    with pytest.raises(ValueError, match="must be >= 1"):
        convert(src, tmp_path / "out", shard_bytes=0)


def _peak_bytes(src: Path, out: Path) -> int:
    PickleDataset(src)  # index first: its build is not the conversion's memory
    tracemalloc.start()
    try:
        convert(src, out, jobs=1, memory_bytes=1 << 20)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_dataset(tmp_path: Path) -> None:
    file_bytes = 40 * 16 * 1024
    for name, files in (("small", 3), ("large", 30)):
        rng = np.random.default_rng(1)
        objects = [([rng.standard_normal(2048) for _ in range(40)], list(range(40)))] * files
        write_files(tmp_path / name, objects)
    small = _peak_bytes(tmp_path / "small", tmp_path / "small-out")
    large = _peak_bytes(tmp_path / "large", tmp_path / "large-out")
    # one decoded file, its copy in flight, and ~10 MiB of buffers: not the 19 MiB of data
    assert large < small * 1.5 + file_bytes
    assert large < 3 * file_bytes + (12 << 20) < 30 * file_bytes


def test_an_error_in_a_worker_process_names_its_file(tmp_path: Path) -> None:
    write_files(tmp_path / "src", [([1, 2], [3, 4]), ([5, 6], [7, WritesUnpicklable()])])
    with pytest.raises(UnencodableValueError) as info:
        convert(tmp_path / "src", tmp_path / "out", jobs=2, trusted=True)
    assert "part-001.pkl" in str(info.value)
    assert info.value.sample == 3
    assert not (tmp_path / "out").exists()
    write_files(tmp_path / "src", [([1, 2], [3, 4]), ([5, 6], [7, 8])])
    assert convert(tmp_path / "src", tmp_path / "out", jobs=2).num_samples == 4
