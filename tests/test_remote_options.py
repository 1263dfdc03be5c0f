"""Storage options belong to the dataset that was given them: two datasets on one bucket (moto's
S3 server on 127.0.0.1, started and stopped here) with different options, opened in one process
in either order, each read with its own, also once pickled (as DataLoader workers get them).

moto takes any key, so the server here refuses requests not signed with the key ``"testing"``
once both datasets are open (:attr:`pickleshard.testing.servers.Traffic.require_key`): the
dataset holding that key reads every sample equal to ``pickle.load``; the other one fails with
its own "access denied" naming the URL. Were options kept per URL prefix in the process, as
before, whichever dataset registered last would decide for both.
"""

from __future__ import annotations

import pickle
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from pickleshard import PickleDataset, build_index
from pickleshard.errors import RemoteStorageError
from pickleshard.io import SourceOptions
from pickleshard.io.options import source_options
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.testing.servers import S3Server

BUCKET = "s3://shared/arrays/"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def local_files(tmp_path_factory: pytest.TempPathFactory, s3: S3Server) -> list[Path]:
    files = write_synthetic(tmp_path_factory.mktemp("opts"), files=2, per_file=5, shape=(3, 4))
    s3.upload("shared", {f"arrays/{p.name}": p.read_bytes() for p in files})
    return files


@pytest.fixture(scope="module")
def oracle(local_files: list[Path]) -> list[tuple[Any, Any]]:
    out: list[tuple[Any, Any]] = []
    for p in local_files:
        with open(p, "rb") as fh:
            xs, ys = pickle.load(fh)
        out += list(zip(xs, ys, strict=True))
    return out


@pytest.fixture
def only_testing_key(s3: S3Server) -> Iterator[None]:
    """From here on the store refuses every request not signed with the key ``testing``."""
    yield
    s3.traffic.require_key = None


def _reads_like_pickle_load(ds: PickleDataset, oracle: list[tuple[Any, Any]]) -> None:
    assert len(ds) == len(oracle)
    for i, (x, y) in enumerate(oracle):
        got = ds[i]
        assert np.array_equal(got[0], x), f"sample {i}"
        assert got[1] == y, f"sample {i}"
    batch = ds.__getitems__(list(range(len(ds)))[::-1])
    for got, (x, y) in zip(batch, oracle[::-1], strict=True):
        assert np.array_equal(got[0], x)
        assert got[1] == y


def _refused(ds: PickleDataset) -> None:
    with pytest.raises(RemoteStorageError) as err:
        ds[len(ds) - 1]
    text = str(err.value)
    assert "access denied" in text
    assert re.search(re.escape(BUCKET) + r"part-\d+\.pkl", text), text
    assert "s3cr3t" not in text  # the options' secret is never in an error


@pytest.mark.parametrize("good_first", [True, False], ids=["good-first", "bad-first"])
def test_two_datasets_on_one_bucket_read_with_their_own_options(
    s3: S3Server,
    local_files: list[Path],
    oracle: list[tuple[Any, Any]],
    tmp_path: Path,
    only_testing_key: None,
    good_first: bool,
) -> None:
    good_options = s3.options(key="testing")
    bad_options = s3.options(key="intruder", secret="s3cr3t")
    made: dict[str, PickleDataset] = {}
    for name in ["good", "bad"] if good_first else ["bad", "good"]:
        options = good_options if name == "good" else bad_options
        # the store takes any key while both are opened (their indexes built)
        made[name] = PickleDataset(BUCKET, storage_options=options, index=tmp_path / name, jobs=1)
    s3.traffic.require_key = "testing"
    good, bad = made["good"], made["bad"]
    _reads_like_pickle_load(good, oracle)
    _refused(bad)
    _reads_like_pickle_load(good, oracle)  # the other's failure left its options alone
    # pickled, as a spawned DataLoader worker or a Dask task gets them: the options travel
    good_copy, bad_copy = pickle.loads(pickle.dumps(good)), pickle.loads(pickle.dumps(bad))
    _refused(bad_copy)
    _reads_like_pickle_load(good_copy, oracle)
    assert good_copy.source_options.storage_options == good_options


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens there once the socket is closed


def test_a_wrong_endpoint_fails_alone_with_an_error_naming_the_url(
    s3: S3Server, local_files: list[Path], oracle: list[tuple[Any, Any]], tmp_path: Path
) -> None:
    good = PickleDataset(BUCKET, storage_options=s3.options(), index=tmp_path / "good", jobs=1)
    wrong = s3.options()
    wrong["client_kwargs"] = {
        **wrong["client_kwargs"],
        "endpoint_url": f"http://127.0.0.1:{_closed_port()}",
    }
    with pytest.raises(RemoteStorageError, match=re.escape(BUCKET.rstrip("/"))):
        PickleDataset(BUCKET, storage_options=wrong, index=tmp_path / "wrong", jobs=1)
    _reads_like_pickle_load(good, oracle)
    # and an index build given the wrong endpoint fails the same way, the good one reads on
    with pytest.raises(RemoteStorageError, match=re.escape(BUCKET.rstrip("/"))):
        build_index(BUCKET, index=tmp_path / "wrong2", jobs=1, storage_options=wrong)
    again = PickleDataset(
        BUCKET, storage_options=s3.options(), index=tmp_path / "good", rebuild="never"
    )
    _reads_like_pickle_load(again, oracle)


def test_source_options_pickle_their_settings_and_no_cache(s3: S3Server) -> None:
    options = SourceOptions(s3.options(secret="s3cr3t"), block_cache_bytes=4 << 20)
    cache = options.block_cache
    assert cache is not None
    assert cache.budget == 4 << 20
    assert options.block_cache is cache  # one per process
    copy = pickle.loads(pickle.dumps(options))
    assert copy.storage_options == options.storage_options
    assert copy.block_cache is not None
    assert copy.block_cache is not cache
    assert "s3cr3t" not in repr(options)
    with pytest.raises(ValueError, match="budget"):
        SourceOptions(block_cache_bytes=10, block_size=1 << 20)
    with pytest.raises(ValueError, match="block_cache_bytes"):
        PickleDataset(BUCKET, storage_options=options, block_cache_bytes=1 << 20)


def test_storage_options_arguments_are_read_one_way() -> None:
    assert source_options(None) is None
    wrapped = source_options({"anon": True}, 1 << 20)
    assert wrapped is not None
    assert wrapped.storage_options == {"anon": True}
    assert wrapped.block_cache_bytes == 1 << 20
    given = SourceOptions({"anon": True})
    assert source_options(given) is given
    with pytest.raises(ValueError, match="brings its own block cache"):
        source_options(given, 1 << 20)
