"""The byte-source layer: LocalFile and an in-memory source pass the shared kit, a new storage
is one class (the scanner reads a pickle through it and finds what it finds in the local file),
and scans choose their readahead so that a cold sparse scan fetches what it examines."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from pickleshard.cli import main
from pickleshard.errors import UnreadableFileError
from pickleshard.io import ByteSource, LocalFile, storage_read_bytes
from pickleshard.io.base import _check_range
from pickleshard.io.identity import FileIdentity
from pickleshard.scan import ScanResult, scan_file
from pickleshard.scan.access import PROBE_BYTES, choose_pattern
from pickleshard.testing.sources import ByteSourceTests


class MemorySource(ByteSource):
    """Bytes in memory: no ``map()``, no ``fileno()``; pickles by value. The whole of what a
    new kind of storage has to write."""

    protocol = "mem"

    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.data, self.version = name, data, 0

    @property
    def size(self) -> int:
        return len(self.data)

    def readinto_at(self, offset: int, view: memoryview) -> int:
        _check_range(offset, len(view))
        chunk = self.data[offset : offset + len(view)]
        view[: len(chunk)] = chunk
        return len(chunk)

    def identity(self) -> FileIdentity:
        return FileIdentity(len(self.data), mtime_ns=self.version)

    def replace(self, data: bytes) -> None:
        self.data, self.version = data, self.version + 1

    def close(self) -> None:
        pass


class TestLocalFile(ByteSourceTests):
    def make_source(self, path: Path, data: bytes) -> ByteSource:
        return LocalFile(path)


class TestMemorySource(ByteSourceTests):
    def make_source(self, path: Path, data: bytes) -> ByteSource:
        return MemorySource(f"mem://{path.name}", data)

    def rewrite(self, path: Path, source: ByteSource, data: bytes) -> None:
        assert isinstance(source, MemorySource)
        source.replace(data)


def _seed_file(path: Path, n: int, shape: tuple[int, ...], protocol: int = 5) -> Path:
    """The seed layout: ``pickle.dump((x_list, y_list))`` of float32 arrays and int labels."""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
    path.write_bytes(pickle.dumps((xs, [i % 10 for i in range(n)]), protocol))
    return path


def _same_scan(a: ScanResult, b: ScanResult) -> None:
    # bytes_fetched is a measurement of the storage (page cache state), not of the scan
    assert {**a.meta(), "bytes_fetched": None} == {**b.meta(), "bytes_fetched": None}
    for name, array in a.arrays_dict().items():
        assert np.array_equal(array, b.arrays_dict()[name]), name


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_scan_through_a_memory_source_is_the_scan_of_the_file(
    tmp_path: Path, protocol: int
) -> None:
    path = _seed_file(tmp_path / "seed.pkl", 300, (3, 40, 40), protocol)
    data = path.read_bytes()
    local = scan_file(path, engine="python")
    memory = MemorySource(str(path), data)
    got = scan_file(memory, engine="python")
    _same_scan(got, local)
    assert got.bytes_read == local.bytes_read
    # the same samples: every field's span holds the same bytes in both, and they unpickle
    # (through the span reader of the local file) to what pickle.load gives
    for i in range(got.num_samples):
        for f in range(len(got.fields)):
            lo, hi = int(got.starts[i, f]), int(got.ends[i, f])
            assert memory.read_at(lo, hi - lo) == LocalFile(path).read_at(lo, hi - lo)
    with pickle.loads(pickle.dumps(memory)) as again:
        _same_scan(scan_file(again, engine="python"), local)


def test_scan_file_leaves_a_given_source_open_and_advised(tmp_path: Path) -> None:
    path = _seed_file(tmp_path / "big.pkl", 40, (3, 112, 112))  # 150 KB samples
    source = LocalFile(path)
    scan = scan_file(source)
    assert source.pattern == "random"
    assert source.read_at(0, 2) == path.read_bytes()[:2]  # still open
    source.close()
    _same_scan(scan, scan_file(path))


def test_the_probe_tells_sparse_from_dense_files(tmp_path: Path) -> None:
    sparse = _seed_file(tmp_path / "sparse.pkl", 40, (3, 112, 112))  # 150 KB apart
    dense = _seed_file(tmp_path / "dense.pkl", 400, (3, 32, 32))  # 12 KB apart
    objects = tmp_path / "objects.pkl"
    objects.write_bytes(pickle.dumps([{"a": [i] * 20, "b": str(i)} for i in range(40_000)], 5))
    small = _seed_file(tmp_path / "small.pkl", 1, (3, 112, 112))
    assert small.stat().st_size < PROBE_BYTES
    got = {p.stem: choose_pattern(LocalFile(p)) for p in (sparse, dense, objects, small)}
    assert got == {
        "sparse": "random",
        "dense": "sequential",
        "objects": "sequential",
        "small": "sequential",
    }


def test_a_probe_over_bad_bytes_leaves_the_error_to_the_walk(tmp_path: Path) -> None:
    path = tmp_path / "junk.pkl"
    path.write_bytes(b"\x80\x05" + b"\xff" * (2 * PROBE_BYTES))
    assert choose_pattern(LocalFile(path)) in ("random", "sequential")


def test_bytes_fetched_travels_with_the_scan(tmp_path: Path) -> None:
    path = _seed_file(tmp_path / "seed.pkl", 50, (3, 32, 32))
    scan = scan_file(path)
    if storage_read_bytes() is None:
        assert scan.bytes_fetched is None
    else:
        assert scan.bytes_fetched is not None
        assert scan.bytes_fetched >= 0
    again = ScanResult.from_stored(path, scan.meta(), scan.arrays_dict())
    assert again.bytes_fetched == scan.bytes_fetched


def test_a_cold_sparse_scan_fetches_what_it_examines(tmp_path: Path) -> None:
    """Evicted from the page cache, a file of 150 KB arrays is scanned fetching a few percent
    of it: the default readahead (8 MiB on a disk whose read_ahead_kb is 8192) fetched it all."""
    path = _seed_file(tmp_path / "cold.pkl", 200, (3, 112, 112))  # 30 MB
    source = LocalFile(path)
    os.fsync(source.fileno())  # dirty pages are not evicted
    source.evict()
    before = storage_read_bytes()
    source.read_at(path.stat().st_size // 2, 1)
    after = storage_read_bytes()
    if before is None or after is None or after == before:
        pytest.skip("storage reads are not counted here (no /proc/self/io, or tmpfs)")
    source.evict()
    scan = scan_file(path)
    assert scan.bytes_fetched is not None
    assert scan.bytes_fetched < 0.15 * path.stat().st_size, scan.bytes_fetched


def test_index_and_inspect_report_bytes_fetched_beside_bytes_examined(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    paths = [_seed_file(data / f"part-{k}.pkl", 30, (3, 64, 64)) for k in range(2)]
    assert main(["index", str(data), "--index", str(tmp_path / "idx"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["span_bytes"] == sum(p.stat().st_size for p in paths)
    assert doc["bytes_examined"] == sum(scan_file(p).bytes_read for p in paths)
    assert 0 < doc["bytes_examined"] < doc["span_bytes"]
    if storage_read_bytes() is None:
        assert doc["bytes_fetched"] is None
    else:
        assert 0 <= doc["bytes_fetched"] <= 2 * doc["span_bytes"]
    assert main(["inspect", str(paths[0])]) == 0
    text = capsys.readouterr().out
    assert ("fetched" in text) == (storage_read_bytes() is not None)


def test_identity_of_an_unopenable_file_says_it_cannot_be_opened(tmp_path: Path) -> None:
    # the open's own error, not re-wrapped as "cannot stat: ... cannot open"
    missing = LocalFile(tmp_path / "gone.pkl")
    with pytest.raises(UnreadableFileError) as info:
        missing.identity()
    assert "cannot open" in str(info.value)
    assert "cannot stat" not in str(info.value)
