"""Indexing remote objects: a dense file (12 KB samples) fetched like a download, a sparse one
(150 KB samples) by coalesced windows, against the range server with added latency and moto's
S3 (both on 127.0.0.1, started and stopped here), requests and bytes counted by the servers.
The oracle is the index of the same files on local disk, and ``pickle.load``."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from pickleshard import DatasetIndex, PickleDataset, build_index
from pickleshard.executors.local import InlineExecutor
from pickleshard.index.files import fingerprint
from pickleshard.io.remote import source as remote
from pickleshard.io.remote.inflight import InFlightBytes
from pickleshard.io.remote.known import identity_from_info
from pickleshard.io.remote.link import MAX_GAP, MIN_GAP, LinkEstimate
from pickleshard.io.remote.listing import resolve_urls
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.scan import scan_file
from pickleshard.scan import sparse as sparse_scan
from pickleshard.testing.servers import RangeHTTPServer, S3Server


@pytest.fixture(scope="module", autouse=True)
def _index_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PICKLESHARD_INDEX_HOME", str(tmp_path_factory.mktemp("indexes")))
        yield


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_synthetic(
        tmp_path_factory.mktemp("dense"), files=2, per_file=1500, shape=(3, 32, 32)
    )


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_synthetic(
        tmp_path_factory.mktemp("sparse"), files=2, per_file=80, shape=(3, 112, 112)
    )


@pytest.fixture(scope="module")
def http() -> Iterator[RangeHTTPServer]:
    server = RangeHTTPServer({}, latency=0.005).start()
    yield server
    server.stop()


def _serve(server: RangeHTTPServer, paths: list[Path], prefix: str) -> list[str]:
    for p in paths:
        server.files[f"/{prefix}/{p.name}"] = p.read_bytes()
    return [f"{server.url}/{prefix}/{p.name}" for p in paths]


# what only a remote object's row has (its ETag, the fetches its scan made) or a local file's
_WHERE = ("path", "mtime_ns", "ctime_ns", "ino", "etag")
_FETCHED = ("requests", "bytes_fetched")


def _same_as_local(remote_idx: DatasetIndex, paths: list[Path], tmp_path: Path) -> None:
    """The index of the objects holds what the index of the same files on local disk holds:
    every row of the files table but where the file lives, and every per-sample array."""
    local = build_index([str(p) for p in paths], index=tmp_path / "local", jobs=1)
    assert remote_idx.num_samples == local.num_samples
    assert remote_idx.header["fields"] == local.header["fields"]
    for r, f in zip(remote_idx.files, local.files, strict=True):
        got, want = asdict(r), asdict(f)
        assert Path(got.pop("path")).name == Path(want.pop("path")).name
        for name in _WHERE[1:]:
            got.pop(name), want.pop(name)
        scanned = [
            {k: v for k, v in (row.pop("scan") or {}).items() if k not in _FETCHED}
            for row in (got, want)
        ]
        assert scanned[0] == scanned[1]
        assert got == want  # fingerprint, size, samples, layout, fields, decoded size...
    assert np.array_equal(remote_idx.samples, local.samples)
    assert remote_idx.spans.keys() == local.spans.keys()
    for name, array in local.spans.items():
        assert np.array_equal(remote_idx.spans[name], array), name


def test_a_dense_file_is_indexed_like_a_download(
    http: RangeHTTPServer, dense: list[Path], tmp_path: Path
) -> None:
    urls = _serve(http, dense, "dense")
    total = sum(p.stat().st_size for p in dense)
    http.traffic.reset()
    idx = build_index(urls, index=tmp_path / "remote", jobs=1)
    samples = idx.num_samples
    # a few requests a file (metadata, fingerprint, walk, the download's windows) whatever its
    # length, where it was one a sample: 1,500 samples a file here (bench: 2,500, <= 0.01)
    assert http.traffic.requests <= 20 * len(dense) < 0.015 * samples, http.traffic.requests
    # on each file's critical path: its lookup, its head, its download (the fingerprint is
    # taken from the download, the identity from the lookup)
    assert http.traffic.requests == 3 * len(dense), http.traffic.requests
    assert http.traffic.sent <= 1.1 * total  # the file once, and little more
    _same_as_local(idx, dense, tmp_path)
    counted = sum(int(f.scan["requests"]) for f in idx.files if f.scan)
    assert 0 < counted <= http.traffic.requests  # the index records what its scans asked
    http.traffic.reset()  # the identities recorded are those a staleness check finds: fresh
    again = PickleDataset(urls, index=tmp_path / "remote", jobs=1)
    assert len(again) == samples
    assert http.traffic.sent < 0.01 * total, http.traffic.sent  # no scan again


def test_a_sparse_file_fetches_under_5_percent(
    http: RangeHTTPServer, sparse: list[Path], tmp_path: Path
) -> None:
    urls = _serve(http, sparse, "sparse")
    total = sum(p.stat().st_size for p in sparse)
    http.traffic.reset()
    idx = build_index(urls, index=tmp_path / "remote", jobs=1)
    assert http.traffic.sent <= 0.05 * total, http.traffic.sent / total
    # the windows predicted at the sample stride go out together: far fewer requests than
    # round trips would allow one at a time (80 samples a file)
    assert http.traffic.requests <= 1.5 * idx.num_samples
    _same_as_local(idx, sparse, tmp_path)


def test_index_json_reports_requests_bytes_and_time(
    http: RangeHTTPServer, dense: list[Path], tmp_path: Path
) -> None:
    urls = _serve(http, dense, "cli")
    out = subprocess.run(
        [sys.executable, "-m", "pickleshard", "index", urls[0], "--json", "--jobs", "1"],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "PICKLESHARD_INDEX_HOME": str(tmp_path)},
    )
    summary = json.loads(out.stdout)
    assert summary["samples"] == 1500
    assert 0 < summary["requests"] <= 15
    assert summary["requests_per_sample"] == round(summary["requests"] / 1500, 5)
    assert summary["bytes_fetched"] >= dense[0].stat().st_size * 0.9
    assert summary["seconds"] > 0
    assert summary["seconds"] > 0
    assert "fetch_seconds" not in summary  # the index keeps counts, not waits


def test_a_dense_index_over_moto_s3(dense: list[Path], tmp_path: Path) -> None:
    server = S3Server(latency=0.002).start()
    try:
        server.upload("dense", {f"d/{p.name}": p.read_bytes() for p in dense})
        server.traffic.reset()
        ds = PickleDataset("s3://dense/d/", storage_options=server.options(), jobs=1)
        # a few requests a file whatever its length (listing, metadata, fingerprint, head,
        # the download's windows), against one a sample before: 1,500 samples a file here
        assert server.traffic.requests <= 20 * len(dense), server.traffic.requests
        with open(dense[1], "rb") as fh:
            xs, ys = pickle.load(fh)
        x, y = ds[len(ds) - 1]
        assert np.array_equal(x, xs[-1])
        assert y == ys[-1]
        _same_as_local(ds.index, dense, tmp_path)
    finally:
        server.stop()


def test_an_open_takes_the_identity_its_lookup_just_found(
    http: RangeHTTPServer, dense: list[Path]
) -> None:
    urls = _serve(http, dense, "known")
    resolve_urls(urls)  # one metadata request an object, their answers kept for the opens
    http.traffic.reset()
    src = remote.FsspecSource(urls[0])
    assert src.size == dense[0].stat().st_size
    assert http.traffic.requests == 0  # the lookup's answer, not a second request
    fs, path = remote.filesystem(urls[0])
    assert src.identity() == identity_from_info(fs.info(path))  # as a staleness check sees it
    http.traffic.reset()
    assert remote.FsspecSource(urls[0]).size == src.size
    assert http.traffic.requests == 1  # an answer serves one open: the next one asks
    http.traffic.reset()
    expecting = remote.FsspecSource(urls[0], identity_ttl=0.3)
    expecting.expect(src.identity())  # what a reader does: the index's record of the object
    assert expecting.size == src.size
    assert http.traffic.requests == 0  # an open expecting what one just asked: no request
    time.sleep(0.35)  # its identity counts from when it was asked, not from this open
    assert expecting.identity() == src.identity()
    assert http.traffic.requests == 1
    wrong = remote.FsspecSource(urls[0])
    wrong.expect(identity_from_info(fs.info(remote.filesystem(urls[1])[1])))  # another version
    http.traffic.reset()
    assert wrong.size == src.size
    assert http.traffic.requests == 1  # not what was asked of that object: it asks


def test_a_reader_opened_after_the_check_asks_no_metadata(
    http: RangeHTTPServer, dense: list[Path], tmp_path: Path
) -> None:
    """The dataset's check against its index just asked for each object's identity: its
    readers' opens take it, and the first batch's fetch carries what settling the plan reads
    (the labels' region), so an open is its head's request, then the batch's."""
    urls = _serve(http, dense, "reuse")
    build_index(urls, index=tmp_path / "index", jobs=1)
    ds = PickleDataset(urls, index=tmp_path / "index")
    http.traffic.reset()
    ds.prefetch(list(range(8)))  # opens the first file's reader, fetches 8 samples and its ints
    assert http.traffic.requests == http.traffic.gets  # no metadata request
    assert http.traffic.gets <= 3  # the head; the samples and the labels' region, at once
    sent = http.traffic.requests
    with open(dense[0], "rb") as fh:
        xs, ys = pickle.load(fh)
    got = ds.__getitems__(list(range(8)))
    assert http.traffic.requests == sent  # the plan settled, the batch read: from that fetch
    for k, (x, y) in enumerate(got):
        assert np.array_equal(x, xs[k])
        assert y == ys[k]


def test_an_objects_head_is_one_request_for_the_reads_inside_it(http: RangeHTTPServer) -> None:
    data = np.random.default_rng(5).integers(0, 256, 3 << 20, np.uint8).tobytes()
    http.files["/head.bin"] = data
    src = remote.FsspecSource(f"{http.url}/head.bin")
    head = remote.head_bytes(len(data))
    assert remote.HEAD_MIN <= head <= remote.HEAD_BYTES
    assert src.size == len(data)  # opened: its metadata
    http.traffic.reset()
    # a sniff, a header, the fingerprint's first block, a scan's first windows
    for offset, n in [(0, 6), (0, 4096), (100, 2048), (head - 10, 10)]:
        assert src.read_at(offset, n) == data[offset : offset + n]
    assert http.traffic.requests == 1
    assert src.read_at(head - 10, 20) == data[head - 10 : head + 10]  # past it: fetched
    assert http.traffic.requests == 2
    with pytest.MonkeyPatch.context() as mp:  # a download from inside the head: the rest
        mp.setattr(remote, "DOWNLOAD_WINDOW", 1 << 20)
        view = bytearray(len(data) - 100)
        assert src.readinto_at(100, memoryview(view)) == len(view)
    assert bytes(view) == data[100:]
    assert http.traffic.sent < len(data) + 2 * head


def _sleepy(k: int, barrier: threading.Barrier) -> int:
    if k < 3:
        barrier.wait()  # returns only once the first three run at once
    if k == 4:
        raise ValueError("file 4 is bad")
    return k * 10


def test_inline_threads_run_files_at_once_and_yield_in_task_order() -> None:
    barrier = threading.Barrier(3, timeout=10)
    results = InlineExecutor(threads=3).run(_sleepy, [(k, barrier) for k in range(6)])
    assert [next(results) for _ in range(4)] == [(0, 0), (1, 10), (2, 20), (3, 30)]
    with pytest.raises(ValueError, match="file 4"):
        next(results)
    with pytest.raises(ValueError, match="at least 1"):
        InlineExecutor(threads=0)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 150), min_size=1, max_size=12))
def test_bytes_in_flight_stay_within_the_budget(sizes: list[int]) -> None:
    budget = InFlightBytes(100)
    seen: list[int] = []

    def fetch(n: int) -> None:
        with budget.hold(n):
            seen.append(budget.held)

    threads = [threading.Thread(target=fetch, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(seen) == len(sizes)
    assert budget.held == 0
    # a batch larger than the budget goes alone; together the others stay under it
    assert budget.peak <= max(100, max(sizes))
    assert all(h <= 100 or h in sizes for h in seen)


def test_the_latency_server_waits_and_counts(http: RangeHTTPServer) -> None:
    http.files["/lat.bin"] = b"x" * 10
    src = remote.FsspecSource(f"{http.url}/lat.bin")
    http.traffic.reset()
    assert src.read_at(2, 3) == b"xxx"
    assert http.traffic.requests >= 2  # the metadata request and the read
    assert src.counters.seconds >= 0.005  # the latency, waited once per fetch at least
    assert src.link.latency >= 0.005


@settings(max_examples=40, deadline=None)
@given(
    offset=st.integers(0, 3 << 20),
    n=st.integers(0, 20 << 20),
    window=st.sampled_from([1 << 20, 3 << 20]),
)
def test_large_reads_go_out_as_windows_and_equal_the_slice(
    offset: int, n: int, window: int
) -> None:
    import fsspec

    data = np.random.default_rng(offset).integers(0, 256, 9 << 20, np.uint8).tobytes()
    fsspec.filesystem("memory").pipe("/win/blob.bin", data)
    src = remote.FsspecSource("memory://win/blob.bin")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(remote, "DOWNLOAD_WINDOW", window)
        mp.setattr(remote, "MAX_WINDOW", window)
        assert src.read_at(offset, n) == data[offset : offset + n]
        view = bytearray(n)
        got = src.readinto_at(offset, memoryview(view))
        assert bytes(view[:got]) == data[offset : offset + n]


@given(
    small=st.lists(st.floats(1e-4, 0.2), min_size=1, max_size=40),
    large=st.lists(st.tuples(st.integers(1 << 20, 1 << 28), st.floats(1e-3, 2.0)), max_size=10),
)
def test_the_gap_stays_within_its_bounds(
    small: list[float], large: list[tuple[int, float]]
) -> None:
    link = LinkEstimate()
    for s in small:
        link.observe(1, 100, s)
    for nbytes, s in large:
        link.observe(4, nbytes, s)
    assert link.latency == min(small[-32:])
    assert MIN_GAP <= link.gap() <= MAX_GAP
    if not large:  # bandwidth as assumed until a large fetch measures it
        assert link.bandwidth == pytest.approx(1e8)


@pytest.mark.parametrize("whole_below", [0, 64 << 20])
def test_a_dense_scan_is_the_local_one_fetched_whole_or_in_windows(
    tmp_path: Path, whole_below: int
) -> None:
    import fsspec

    path = write_synthetic(tmp_path, files=1, per_file=600, shape=(3, 32, 32))[0]
    data = path.read_bytes()
    fsspec.filesystem("memory").pipe(f"/dense{whole_below}/{path.name}", data)
    src = remote.FsspecSource(f"memory://dense{whole_below}/{path.name}")
    with pytest.MonkeyPatch.context() as mp:
        # 0: into a temporary file's mirror, by windows of 1 MiB; else one request, walked as is
        mp.setattr(sparse_scan, "IN_MEMORY", whole_below)
        mp.setattr(remote, "DOWNLOAD_WINDOW", 1 << 20)
        mp.setattr(remote, "MAX_WINDOW", 1 << 20)
        got = scan_file(src)
    want = scan_file(path)
    assert (got.layout, got.fields, got.meta()) == (want.layout, want.fields, want.meta())
    for name, array in want.arrays_dict().items():
        assert np.array_equal(got.arrays_dict()[name], array), name
    windows = 1 if whole_below else -(-len(data) // (1 << 20))
    assert src.counters.requests <= 1 + windows  # the head, then the download
    assert src.counters.bytes <= len(data) + remote.head_bytes(len(data))


def test_a_whole_object_held_serves_the_reads_after_it(
    http: RangeHTTPServer, tmp_path: Path
) -> None:
    data = np.random.default_rng(9).integers(0, 256, 1 << 20, np.uint8).tobytes()
    http.files["/whole.bin"] = data
    (tmp_path / "whole.bin").write_bytes(data)  # the oracle: the same bytes on local disk
    for hold in (False, True):
        src = remote.FsspecSource(f"{http.url}/whole.bin")
        if hold:
            src.hold_whole()
        assert src.read_blocks([(0, len(data), [0])])[0] == data
        before = src.counters.requests
        assert fingerprint(src) == fingerprint(tmp_path / "whole.bin")
        assert src.read_at(700_000, 10) == data[700_000:700_010]
        # held: no request; else the head (the first block), the 7 others, and the read
        assert src.counters.requests - before == (0 if hold else 1 + 7 + 1)
        src.close()
