"""Remote datasets over moto's S3 server and a loopback HTTP server (both on 127.0.0.1, started
and stopped here), with ``pickle.load`` of the local files as the oracle and the bytes counted
by the server itself."""

from __future__ import annotations

import json
import os
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from pickleshard import PickleDataset
from pickleshard.errors import RemoteStorageError, StaleIndexError
from pickleshard.io import SourceOptions
from pickleshard.io.remote.source import FsspecSource
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing import same
from pickleshard.testing.servers import RangeHTTPServer, S3Server
from pickleshard.testing.sources import ByteSourceTests

SHAPE = (3, 112, 112)  # float32: 150,528 bytes a sample
FILES, PER_FILE = 2, 12


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def local_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("synthetic")
    return write_synthetic(out, files=FILES, per_file=PER_FILE, shape=SHAPE)


@pytest.fixture(scope="module")
def bucket(s3: S3Server, local_files: list[Path]) -> str:
    s3.upload("data", {f"arrays/{p.name}": p.read_bytes() for p in local_files})
    return "s3://data/arrays/"


@pytest.fixture(scope="module")
def oracle(local_files: list[Path]) -> list[tuple[Any, Any]]:
    out = []
    for p in local_files:
        with open(p, "rb") as fh:
            xs, ys = pickle.load(fh)
        out += list(zip(xs, ys, strict=True))
    return out


@pytest.fixture(scope="module", autouse=True)
def _index_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PICKLESHARD_INDEX_HOME", str(tmp_path_factory.mktemp("indexes")))
        yield


def _total(local_files: list[Path]) -> int:
    return sum(p.stat().st_size for p in local_files)


def _epoch(ds: PickleDataset, seed: int, batch: int = 8) -> list[int]:
    """A shuffled epoch in batches (as a DataLoader asks); the indices read, in order."""
    perm = np.random.default_rng(seed).permutation(len(ds)).tolist()
    seen: list[int] = []
    for k in range(0, len(perm), batch):
        idx = perm[k : k + batch]
        for i, sample in zip(idx, ds.__getitems__(idx), strict=True):
            assert same(sample, ds_oracle[i]), f"sample {i} differs from pickle.load"
            seen.append(i)
    return seen


ds_oracle: list[tuple[Any, Any]] = []


@pytest.fixture(scope="module")
def built(s3: S3Server, bucket: str, oracle: list[tuple[Any, Any]]) -> tuple[PickleDataset, int]:
    """The dataset over the bucket, indexed once, and the bytes the server sent for that."""
    ds_oracle[:] = oracle
    s3.traffic.reset()
    ds = PickleDataset(bucket, storage_options=s3.options(), jobs=1)
    return ds, s3.traffic.sent


@pytest.fixture
def dataset(built: tuple[PickleDataset, int]) -> PickleDataset:
    return built[0]


def test_indexing_transfers_under_5_percent(
    built: tuple[PickleDataset, int], local_files: list[Path]
) -> None:
    dataset, sent = built
    assert len(dataset) == FILES * PER_FILE
    assert dataset.file_modes == ("span",) * FILES
    assert 0 < sent < 0.05 * _total(local_files), f"indexing moved {sent} bytes"
    assert Path(dataset.index.path).is_relative_to(os.environ["PICKLESHARD_INDEX_HOME"])
    assert all(f.etag for f in dataset.index.files)  # staleness by ETag, not by inode
    assert all(f.ino is None and f.ctime_ns is None for f in dataset.index.files)


def test_a_shuffled_epoch_moves_at_most_1_5x_the_bytes(
    s3: S3Server, dataset: PickleDataset, local_files: list[Path]
) -> None:
    s3.traffic.reset()
    seen = _epoch(dataset, seed=1)
    assert sorted(seen) == list(range(len(dataset)))
    assert s3.traffic.sent <= 1.5 * _total(local_files), s3.traffic.sent
    assert s3.traffic.gets <= 2 * len(dataset)  # never a whole file per sample


def test_faults_mid_epoch_are_retried_and_lose_or_repeat_nothing(
    s3: S3Server, dataset: PickleDataset
) -> None:
    dataset[0]  # readers open; then the connection drops and the store fails mid-epoch
    s3.traffic.faults = ["drop", "503", "drop", "503"]
    seen = _epoch(dataset, seed=2)
    assert s3.traffic.faults == []  # every fault was met
    assert seen == np.random.default_rng(2).permutation(len(dataset)).tolist()


def test_after_the_last_retry_the_error_names_the_url_and_the_range(
    http_server: RangeHTTPServer,
) -> None:
    http_server.files["/retry.bin"] = bytes(5000)
    url = f"{http_server.url}/retry.bin"
    source = FsspecSource(url, retries=2, backoff=0.01)
    assert source.size == 5000
    http_server.traffic.faults = ["503"] * 3
    with pytest.raises(RemoteStorageError) as err:
        source.read_at(1000, 500)
    assert http_server.traffic.faults == []
    assert url in str(err.value)
    assert "bytes 1000-1500" in str(err.value)
    assert "3 tries" in str(err.value)
    assert err.value.offset == 1000
    http_server.traffic.faults = ["503", "drop"]
    assert source.read_at(1000, 500) == bytes(500)  # two failures, then the bytes


def test_bad_credentials_give_one_clear_error(s3: S3Server, bucket: str) -> None:
    s3.traffic.require_key = "testing"
    try:
        with pytest.raises(RemoteStorageError) as err:
            PickleDataset(bucket, storage_options=s3.options(key="wrong", secret="s3cr3t"))
    finally:
        s3.traffic.require_key = None
    text = str(err.value)
    assert "access denied" in text
    assert "credentials" in text
    assert bucket.rstrip("/") in text
    assert "s3cr3t" not in text
    assert err.value.__cause__ is None


def test_credentials_stay_out_of_the_index_and_reprs(s3: S3Server, dataset: PickleDataset) -> None:
    text = (Path(dataset.index.path) / "index.json").read_text()
    assert s3.options()["secret"] == "testing"
    assert "testing" not in text
    options = SourceOptions({"secret": "s3cr3t"})
    source = FsspecSource("s3://data/arrays/part-00000.pkl", options)
    assert "s3cr3t" not in repr(source)
    assert "s3cr3t" not in repr(options)
    assert "testing" not in repr(dataset.source)  # the resolved source carries its options
    assert dataset.source.options is dataset.source_options


def test_staleness_by_etag(s3: S3Server, tmp_path: Path) -> None:
    small = write_synthetic(tmp_path, files=2, per_file=20, shape=(8,))
    s3.upload("data", {f"stale/{p.name}": p.read_bytes() for p in small})
    options = s3.options()
    ds = PickleDataset("s3://data/stale/", storage_options=options, jobs=1)
    assert len(ds) == 40
    other = write_synthetic(tmp_path / "other", files=2, per_file=20, shape=(8,), seed=1)
    assert other[1].stat().st_size == small[1].stat().st_size  # same size, other bytes
    s3.upload("data", {f"stale/{small[1].name}": other[1].read_bytes()})
    with pytest.raises(StaleIndexError, match=small[1].name):
        PickleDataset("s3://data/stale/", storage_options=options, jobs=1)
    again = PickleDataset("s3://data/stale/", storage_options=options, rebuild="auto", jobs=1)
    assert again.index.files[1].etag != ds.index.files[1].etag


def test_the_block_cache_serves_a_second_epoch(
    s3: S3Server, bucket: str, dataset: PickleDataset
) -> None:
    budget = 64 << 20
    cached = PickleDataset(bucket, storage_options=s3.options(), block_cache_bytes=budget)
    cache = cached.source_options.block_cache
    assert cache is not None
    _epoch(cached, seed=3)
    s3.traffic.reset()
    _epoch(cached, seed=4)
    assert s3.traffic.sent == 0  # every block held: nothing fetched again
    assert 0 < cache.held <= budget
    assert cache.stats.hits > 0
    held, hits = cache.held, cache.stats.hits
    options = SourceOptions(s3.options(), block_cache_bytes=2 << 20, block_size=1 << 20)
    small = PickleDataset(bucket, storage_options=options)
    _epoch(small, seed=5)
    assert small.source_options.block_cache is not None
    assert 0 < small.source_options.block_cache.held <= 2 << 20
    assert (cache.held, cache.stats.hits) == (held, hits)  # each dataset its own cache
    assert dataset.source_options.block_cache is None  # none unless asked for
    s3.traffic.reset()
    _epoch(dataset, seed=6)
    assert s3.traffic.sent > 0  # the cached datasets' blocks serve nobody else


@pytest.mark.slow
def test_a_dataloader_with_two_workers(s3: S3Server, dataset: PickleDataset) -> None:
    torch = pytest.importorskip("torch")
    order = np.random.default_rng(6).permutation(len(dataset)).tolist()
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=order, num_workers=2)
    k = 0
    for xs, ys in loader:
        for x, y in zip(xs, ys, strict=True):
            want = ds_oracle[order[k]]
            assert np.array_equal(x.numpy(), want[0])
            assert int(y) == want[1]
            k += 1
    assert k == len(dataset)


# -- the byte-source kit -----------------------------------------------------------------------
class TestS3Source(ByteSourceTests):
    @pytest.fixture(autouse=True)
    def _server(self, s3: S3Server) -> None:
        self.s3 = s3
        if not hasattr(self, "_bucket"):
            s3.upload("kit", {})
            self._bucket = True

    def make_source(self, path: Path, data: bytes) -> FsspecSource:
        key = f"{uuid.uuid4().hex}.bin"
        self.s3.upload("kit", {key: data})
        return FsspecSource(f"s3://kit/{key}", SourceOptions(self.s3.options()), identity_ttl=0)

    def rewrite(self, path: Path, source: Any, data: bytes) -> None:
        self.s3.upload("kit", {source.url.removeprefix("s3://kit/"): data})

    def count_reads(self, source: Any) -> Any:
        return lambda: source.counters.requests


@pytest.fixture(scope="module")
def http_server() -> Iterator[RangeHTTPServer]:
    server = RangeHTTPServer({}).start()
    yield server
    server.stop()


class TestHTTPSource(ByteSourceTests):
    @pytest.fixture(autouse=True)
    def _server(self, http_server: RangeHTTPServer) -> None:
        self.http = http_server

    def make_source(self, path: Path, data: bytes) -> FsspecSource:
        name = f"/{uuid.uuid4().hex}.bin"
        self.http.files[name] = data
        return FsspecSource(self.http.url + name, identity_ttl=0)

    def rewrite(self, path: Path, source: Any, data: bytes) -> None:
        self.http.files[source.url.removeprefix(self.http.url)] = data

    def count_reads(self, source: Any) -> Any:
        return lambda: source.counters.requests


def test_a_dataset_over_http_urls(
    http_server: RangeHTTPServer, local_files: list[Path], oracle: list[tuple[Any, Any]]
) -> None:
    urls = []
    for p in local_files:
        http_server.files[f"/ds/{p.name}"] = p.read_bytes()
        urls.append(f"{http_server.url}/ds/{p.name}")
    http_server.traffic.reset()
    ds = PickleDataset(urls)
    assert http_server.traffic.sent < 0.05 * _total(local_files)
    ds_oracle[:] = oracle
    assert sorted(_epoch(ds, seed=7)) == list(range(len(oracle)))
    http_server.traffic.faults = ["drop", "503"]
    assert same(ds[len(ds) - 1], oracle[-1])
    assert same(ds[5], oracle[5])
    assert http_server.traffic.faults == []


def test_a_url_with_a_password_is_not_written_to_the_index_or_a_conversion(
    http_server: RangeHTTPServer, local_files: list[Path], tmp_path: Path
) -> None:
    from pickleshard.io.remote.listing import without_credentials

    host = http_server.url.partition("://")[2]
    urls = []
    for p in local_files:
        http_server.files[f"/auth/{p.name}"] = p.read_bytes()
        urls.append(f"http://reader:hunter2@{host}/auth/{p.name}")
    ds = PickleDataset(urls, index=tmp_path / "index")
    assert len(ds) > 0
    header = json.loads((tmp_path / "index" / "index.json").read_text())
    assert "hunter2" not in json.dumps(header)
    assert header["root"] == f"http://{host}/auth"
    from pickleshard import convert

    convert(ds, tmp_path / "converted", to="memmap")
    written = [p.read_bytes() for p in (tmp_path / "converted").rglob("*") if p.is_file()]
    assert written
    assert not any(b"hunter2" in data for data in written)
    assert without_credentials("https://h/a?sig=zz#f") == "https://h/a"
    assert without_credentials("s3://k:s@b/p/x.pkl") == "s3://b/p/x.pkl"
    assert without_credentials("/data/a@b/x.pkl") == "/data/a@b/x.pkl"


def test_the_cli_takes_a_url_and_storage_options(
    s3: S3Server, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pickleshard.cli import main

    flags = [
        "--storage-option=key=testing",
        "--storage-option=secret=testing",
        f"--storage-option=client_kwargs.endpoint_url={s3.endpoint}",
        "--storage-option=client_kwargs.region_name=eu-west-1",
        "--storage-option=config_kwargs.retries.max_attempts=1",
    ]
    assert main(["index", bucket, "--index", str(tmp_path / "idx"), "--jobs", "1", *flags]) == 0
    assert main(["inspect", f"{bucket}part-00000.pkl", "--json", *flags]) == 0
    out = capsys.readouterr().out
    assert f"{bucket}part-00000.pkl" in out
    assert "testing" not in out
    assert (tmp_path / "idx" / "index.json").exists()


def test_a_failed_remote_read_names_the_url_the_range_and_the_sample(
    http_server: RangeHTTPServer, local_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickleshard.io.remote.source as remote

    monkeypatch.setattr(remote, "BACKOFF", 0.001)
    urls = []
    for p in local_files:
        http_server.files[f"/named/{p.name}"] = p.read_bytes()
        urls.append(f"{http_server.url}/named/{p.name}")
    ds = PickleDataset(urls)
    ds[0]  # its reader open and its plan settled
    http_server.traffic.faults = ["503"] * (remote.RETRIES + 1)
    with pytest.raises(RemoteStorageError) as err:
        ds[3]
    assert http_server.traffic.faults == []
    text = str(err.value)
    assert urls[0] in text
    assert "(sample 3)" in text
    assert f"after {remote.RETRIES + 1} tries" in text
    start = int(ds.index.scan(0, urls[0]).starts[3, 0])
    assert f"bytes {start}-" in text
    assert err.value.sample == 3
    # a batch names the sample too (the reader names it, whichever path reads)
    http_server.traffic.faults = ["503"] * (remote.RETRIES + 1)
    with pytest.raises(RemoteStorageError) as err:
        ds.__getitems__([3])
    assert err.value.sample == 3
    assert "(sample 3)" in str(err.value)
