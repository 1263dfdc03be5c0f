"""Indexing remote objects: a dense file (12 KB samples) fetched like a download, a sparse one
(150 KB samples) by coalesced windows, against the range server with added latency and moto's
S3 (both on 127.0.0.1, started and stopped here), requests and bytes counted by the servers.
The oracle is the index of the same files on local disk, and ``pickle.load``."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from pickleshard import PickleDataset, build_index
from pickleshard.io.remote import source as remote
from pickleshard.io.remote.link import MAX_GAP, MIN_GAP, LinkEstimate
from pickleshard.pipelines.synth import write_synthetic
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


def _same_as_local(remote_idx: object, paths: list[Path], tmp_path: Path) -> None:
    local = build_index(paths[0].parent, index=tmp_path / "local", jobs=1)
    assert remote_idx.num_samples == local.num_samples  # type: ignore[attr-defined]
    for r, f in zip(remote_idx.files, local.files, strict=True):  # type: ignore[attr-defined]
        assert (r.mode, r.num_samples, r.fields) == (f.mode, f.num_samples, f.fields)


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
    assert http.traffic.sent <= 1.1 * total  # the file once, and little more
    _same_as_local(idx, dense, tmp_path)
    counted = sum(int(f.scan["requests"]) for f in idx.files if f.scan)
    assert 0 < counted <= http.traffic.requests  # the index records what its scans asked


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


def test_a_dense_index_over_moto_s3(dense: list[Path]) -> None:
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
    finally:
        server.stop()


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
