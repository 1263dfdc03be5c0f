"""Compressed pickles through the whole package: found by the directory scan, detected by their
bytes, read in place through seek points (or a decompressed copy), and equal to ``pickle.load``
of the decompressed file everywhere (``ds[i]``, convert + verify, split)."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compressors import COMPRESSORS, KIND, SUFFIX, compress_to
from pickleshard import PickleDataset
from pickleshard.errors import CorruptPickleError, DecompressedTooLargeError
from pickleshard.io import open_source
from pickleshard.io.compressed.copy import CachedCopy
from pickleshard.io.compressed.source import CompressedSource
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.verify.run import verify
from pickleshard.testing.oracle import assert_same

FORMS = sorted(COMPRESSORS)


def seed_bytes(n: int = 40, protocol: int = 5) -> tuple[bytes, list[tuple[Any, ...]]]:
    """The seed's layout, ``pickle.dump((x_list, y_list))``, and its samples by pickle.load."""
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(n)]
    ys = [int(v) for v in rng.integers(0, 10, n)]
    raw = pickle.dumps((xs, ys), protocol=protocol)
    got = pickle.loads(raw)  # the oracle: the decompressed bytes, loaded whole
    return raw, list(zip(*got, strict=True))


def _same_samples(ds: PickleDataset, want: list[tuple[Any, ...]]) -> None:
    assert len(ds) == len(want)
    for i in range(len(want)):
        assert_same(tuple(ds[i]), want[i], f"sample {i}")


@pytest.mark.parametrize("how", FORMS)
def test_a_directory_of_compressed_pickles_reads_like_pickle_load(tmp_path: Path, how: str) -> None:
    raw, want = seed_bytes()
    folder = tmp_path / "data"
    folder.mkdir()
    compress_to(folder / f"part.pkl{SUFFIX[how]}", raw, how)
    ds = PickleDataset(folder)
    assert ds.index.files[0].mode == "span"  # read in place, not whole
    _same_samples(ds, want)
    # ... and the index is fresh when the dataset is opened again (identity and fingerprint)
    again = PickleDataset(folder, rebuild="never")
    assert_same(tuple(again[len(want) - 1]), want[-1])


def test_a_gzip_file_named_pkl_is_read_as_gzip(tmp_path: Path) -> None:
    raw, want = seed_bytes(12)
    path = tmp_path / "data.pkl"
    path.write_bytes(gzip.compress(raw))
    with open_source(path) as source:
        assert isinstance(source, CompressedSource)
        assert source.kind == "gzip"
    _same_samples(PickleDataset(path), want)


def test_a_plain_pickle_is_not_wrapped(tmp_path: Path) -> None:
    raw, _ = seed_bytes(3)
    (tmp_path / "a.pkl").write_bytes(raw)
    with open_source(tmp_path / "a.pkl") as source:
        assert not isinstance(source, CompressedSource)


@pytest.mark.parametrize("how", ["gzip", "bz2"])
def test_seek_points_are_loaded_on_reopen_and_rebuilt_when_stale(tmp_path: Path, how: str) -> None:
    raw, _ = seed_bytes(30)
    path = compress_to(tmp_path / f"d{SUFFIX[how]}", raw, how)
    with open_source(path) as first:
        assert isinstance(first, CompressedSource)
        assert first.how == "seek points built"
    points = sorted((tmp_path / ".pickleshard" / "compressed").iterdir())
    assert len(points) == 1
    with open_source(path) as second:
        assert isinstance(second, CompressedSource)
        assert second.how == "seek points loaded"  # read from the file, not decoded again
        assert second.read_at(100, 50) == raw[100:150]
    compress_to(path, raw[:-1] + b".", how)  # rewritten: another identity
    with open_source(path) as third:
        assert isinstance(third, CompressedSource)
        assert third.how == "seek points built"
        assert third.read_at(len(raw) - 1, 1) == b"."
    now = sorted((tmp_path / ".pickleshard" / "compressed").iterdir())
    assert len(now) == 1  # the stale seek points were deleted
    assert now != points


def test_damaged_seek_points_are_rebuilt(tmp_path: Path) -> None:
    raw, _ = seed_bytes(30)
    path = compress_to(tmp_path / "d.gz", raw, "gzip")
    with open_source(path) as first:
        assert first.size == len(raw)
    (points,) = (tmp_path / ".pickleshard" / "compressed").iterdir()
    points.write_bytes(b"junk")
    with open_source(path) as second:
        assert isinstance(second, CompressedSource)
        assert second.how == "seek points built"
        assert second.read_at(0, len(raw)) == raw


@pytest.mark.parametrize("how", FORMS)
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_compressed_file_is_one_clear_error(
    tmp_path: Path, how: str, damage: str
) -> None:
    raw, _ = seed_bytes(200)
    blob = COMPRESSORS[how](raw)
    if damage == "truncated":
        blob = blob[: len(blob) * 2 // 3]
    else:  # bytes overwritten in the middle of the compressed data
        mid = len(blob) // 2
        blob = blob[:mid] + bytes(64) + blob[mid + 64 :]
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / f"bad.pkl{SUFFIX[how]}"
    path.write_bytes(blob)
    with pytest.raises(CorruptPickleError) as err:  # indexing decodes every byte once
        PickleDataset(folder)
    assert str(path) in str(err.value)


def test_a_copy_over_its_budget_names_the_file_the_size_and_the_budget(tmp_path: Path) -> None:
    raw, _ = seed_bytes(20)
    path = compress_to(tmp_path / "d.xz", raw, "xz-single")
    inner = open_source(path).inner  # type: ignore[attr-defined]
    source = CompressedSource(inner, "xz", cache_bytes=1000)
    with pytest.raises(DecompressedTooLargeError) as err:
        source.read_at(0, 10)
    text = str(err.value)
    assert str(path) in text
    assert f"{len(raw)} bytes" in text
    assert "1000-byte budget" in text
    assert not list((tmp_path / ".pickleshard" / "compressed").glob("*"))  # no partial copy
    zst = compress_to(tmp_path / "d.zst", raw, "zstd-plain")
    source = CompressedSource(open_source(zst).inner, "zstd", cache_bytes=1000)  # type: ignore[attr-defined]
    with pytest.raises(DecompressedTooLargeError, match="1000-byte budget"):
        source.read_at(0, 10)


def test_a_decompressed_copy_is_reused(tmp_path: Path) -> None:
    raw, _ = seed_bytes(20)
    path = compress_to(tmp_path / "d.xz", raw, "xz-single")
    with open_source(path) as first:
        assert isinstance(first, CompressedSource)
        assert first.how == "cache built"
    with open_source(path) as second:
        assert isinstance(second, CompressedSource)
        assert second.how == "cache reused"
        assert isinstance(second._open(), CachedCopy)
        assert bytes(second.map()[:]) == raw  # the scanner walks the copy's map


@pytest.mark.parametrize("how", ["gzip", "xz-blocks", "zstd-plain"])
def test_convert_and_verify(tmp_path: Path, how: str) -> None:
    raw, want = seed_bytes(25)
    folder = tmp_path / "data"
    folder.mkdir()
    compress_to(folder / f"part{SUFFIX[how]}", raw, how)
    convert(folder, tmp_path / "out", to="memmap", jobs=1)
    report = verify(folder, tmp_path / "out")
    assert report.checked == len(want)
    from pickleshard.formats import open_dataset

    out = open_dataset(tmp_path / "out")
    for i in (0, len(want) - 1):
        assert_same(tuple(out[i]), want[i])


def test_the_compressed_kinds_are_the_ones_sniffed() -> None:
    assert set(KIND.values()) == {"gzip", "bz2", "xz", "zstd"}
    assert os.sep not in "".join(SUFFIX.values())


def test_inspect_reports_the_compression_then_the_decompressed_opcodes(tmp_path: Path) -> None:
    from pickleshard.inspect.file import inspect_file

    raw, want = seed_bytes(30, protocol=4)
    plain = tmp_path / "seed.pkl"
    plain.write_bytes(raw)
    path = compress_to(tmp_path / "seed.pkl.bz2", raw, "bz2")
    report = inspect_file(path)
    reference = inspect_file(plain)
    assert report.compression is not None
    assert report.compression["format"] == "bz2"
    assert report.compression["compressed_size"] == path.stat().st_size
    assert report.compression["size"] == report.size == len(raw)
    # the opcodes of the decompressed stream (those of the plain file), never "BZh9" read as ones
    assert (report.protocol, report.opcodes, report.counts) == (
        reference.protocol,
        reference.opcodes,
        reference.counts,
    )
    assert (report.layout, report.samples) == ("columns", len(want))
    assert report.to_json()["compression"]["format"] == "bz2"
    assert reference.compression is None


@pytest.mark.parametrize("how", ["gzip", "zstd-seekable"])
def test_split_a_compressed_file(tmp_path: Path, how: str) -> None:
    from pickleshard.pipelines.split.run import split

    raw, want = seed_bytes(30)
    path = compress_to(tmp_path / f"big.pkl{SUFFIX[how]}", raw, how)
    split(path, tmp_path / "out", max_samples=8)
    parts = sorted((tmp_path / "out").glob("*.pickle"))
    assert len(parts) == 4
    got = []
    for part in parts:
        with open(part, "rb") as fh:  # the chunks are plain pickles
            xs, ys = pickle.load(fh)
        got += list(zip(xs, ys, strict=True))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)


@pytest.mark.parametrize("how", ["gzip", "bz2", "xz-blocks", "zstd-seekable"])
def test_a_scan_walks_a_decoded_temporary_file_not_memory(tmp_path: Path, how: str) -> None:
    import mmap

    raw, _ = seed_bytes(40)
    with open_source(compress_to(tmp_path / f"d{SUFFIX[how]}", raw, how)) as source:
        mapped = source.map()
        assert isinstance(mapped, mmap.mmap)  # page cache, not the process's heap
        assert mapped[:] == raw
        assert source.map() is mapped  # decoded once
    assert not [p for p in (tmp_path / ".pickleshard" / "compressed").iterdir() if "tmp" in p.name]


def test_a_missing_decoder_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from pickleshard.errors import MissingDependencyError

    raw, _ = seed_bytes(5)
    path = compress_to(tmp_path / "d.bz2", raw, "bz2")
    monkeypatch.setitem(sys.modules, "indexed_bzip2", None)  # import fails as if not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'pickleshard\[compressed\]'"):
        open_source(path).read_at(0, 1)


def test_a_rewritten_compressed_file_makes_the_index_stale(tmp_path: Path) -> None:
    from pickleshard.errors import StaleIndexError

    raw, _ = seed_bytes(20)
    folder = tmp_path / "data"
    folder.mkdir()
    path = compress_to(folder / "part.pkl.gz", raw, "gzip")
    ds = PickleDataset(folder)
    entry = ds.index.files[0]
    assert entry.size == len(raw)  # spans are offsets into the decompressed stream
    assert entry.ino == path.stat().st_ino  # ... stamped with the compressed file's identity
    other, _ = seed_bytes(21)
    compress_to(path, other, "gzip")
    with pytest.raises(StaleIndexError, match=r"part\.pkl\.gz"):
        PickleDataset(folder, rebuild="never")


_FORK_THEN_EXIT = """
import os, sys
from pickleshard.io import open_source
source = open_source(sys.argv[1])
source.read_at(100, 10)  # the parent's decoder is open, its threads running
pid = os.fork()
if pid == 0:
    source.read_at(200, 10)
    sys.exit(0)  # a normal exit: the interpreter finalizes what the child holds
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
@pytest.mark.parametrize("how", ["gzip", "bz2"])
def test_a_forked_child_that_exits_normally_does_not_abort(tmp_path: Path, how: str) -> None:
    import subprocess
    import sys

    raw, _ = seed_bytes(10)
    path = compress_to(tmp_path / f"d{SUFFIX[how]}", raw, how)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run(
        [sys.executable, "-c", _FORK_THEN_EXIT, os.fspath(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0", out.stderr  # the child's exit code (SIGABRT: -6)


def test_a_directory_passes_over_compressed_tar_archives(tmp_path: Path) -> None:
    import tarfile

    from pickleshard.io.filenames import is_pickle_name
    from pickleshard.io.listing import resolve_source

    raw, expected = seed_bytes(6)
    folder = tmp_path / "data"
    folder.mkdir()
    compress_to(folder / "part.pkl.gz", raw, "gzip")
    with tarfile.open(folder / "backup.tar.gz", "w:gz") as tar:  # not a pickle: never read
        tar.add(folder / "part.pkl.gz", arcname="part.pkl.gz")
    assert resolve_source(folder).files == ("part.pkl.gz",)
    assert len(PickleDataset(folder)) == len(expected)
    assert not is_pickle_name("x.TAR.XZ")
    assert not is_pickle_name("x.tar.zst")
    assert is_pickle_name("x.xz")
    assert is_pickle_name("x.pkl")
