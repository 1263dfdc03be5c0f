"""``pickleshard.Loader`` over remote files: the latency range server and moto's S3 (both on
127.0.0.1, started and stopped here). Batches equal ``default_collate`` of the local files'
samples in the sampler's order; the reads ahead overlap their round trips; the bytes fetched
stay near the samples' own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import default_collate

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from pickleshard import Loader, PickleDataset, ShuffleSampler
from pickleshard.io.remote.staging import staged_ranges
from pickleshard.testing.resume import check_loader_resume, write_id_files
from pickleshard.testing.servers import RangeHTTPServer, S3Server

SIZES = [40, 25, 31]  # 96 samples of 3072 float32 (+ their id)
LATENCY = 0.02


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("ids") / "data"
    write_id_files(folder, SIZES, dim=3072)  # 12 KB samples, as the issue measures
    return sorted(folder.iterdir())


@pytest.fixture(scope="module")
def local(files: list[Path]) -> PickleDataset:
    return PickleDataset(files)


@pytest.fixture(scope="module", autouse=True)
def _index_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PICKLESHARD_INDEX_HOME", str(tmp_path_factory.mktemp("indexes")))
        yield


@pytest.fixture(scope="module")
def http(files: list[Path]) -> Iterator[RangeHTTPServer]:
    server = RangeHTTPServer({f"/ids/{p.name}": p.read_bytes() for p in files}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3(files: list[Path]) -> Iterator[S3Server]:
    server = S3Server().start()
    server.upload("loader", {f"ids/{p.name}": p.read_bytes() for p in files})
    yield server
    server.stop()


def _want(local: PickleDataset, seed: int, batch_size: int) -> list[Any]:
    order = list(ShuffleSampler(local, seed=seed))
    return [
        default_collate([local[i] for i in order[a : a + batch_size]])
        for a in range(0, len(order), batch_size)
    ]


def _check(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(gx, wx)
        assert torch.equal(gy, wy)


@pytest.mark.parametrize("read_ahead", [False, True])
def test_over_the_latency_server_reads_overlap(
    http: RangeHTTPServer, files: list[Path], local: PickleDataset, read_ahead: bool
) -> None:
    ds = PickleDataset([f"{http.url}/ids/{p.name}" for p in files])
    http.traffic.latency = LATENCY
    try:
        http.traffic.reset()
        loader = Loader(
            ds, 8, sampler=ShuffleSampler(ds, seed=1), prefetch=6, read_ahead=read_ahead
        )
        got = list(loader)
        gets, sent = http.traffic.gets, http.traffic.sent
    finally:
        http.traffic.latency = 0.0
    _check(got, _want(local, 1, 8))
    stats = loader.stats
    assert stats.max_in_flight > 1, "the next batches' reads were in flight"
    sample_bytes = sum(p.stat().st_size for p in files)
    assert sent <= 1.5 * sample_bytes
    if not read_ahead:
        # each batch waits on at least one round trip per file it touches: read one after
        # another, 12 batches would take more than 12 * LATENCY; overlapped, their waits add
        # to more than the epoch's wall time
        assert stats.read_s > stats.seconds, stats
        assert gets <= len(ds) + 2 * len(files), "one ranged GET a sample (+ opening each file)"
    else:
        # the groups' ranges of one file go out together, neighbours merged: fewer GETs than
        # samples, and the batch reads find their bytes staged (no round trip of their own)
        print(f"read ahead: {gets} GETs for {len(ds)} samples, {sent} bytes")
        assert gets < 0.9 * len(ds) + 2 * len(files), gets
        assert stats.read_s < 12 * LATENCY, stats


def test_a_pass_left_before_its_end_leaves_nothing_staged(
    http: RangeHTTPServer, files: list[Path], local: PickleDataset
) -> None:
    ds = PickleDataset([f"{http.url}/ids/{p.name}" for p in files])
    stage = staged_ranges()
    stage.clear()
    loader = Loader(ds, 8, sampler=ShuffleSampler(ds, seed=4), prefetch=6, read_ahead=True)
    it = iter(loader)
    first = next(it)
    _check([first], _want(local, 4, 8)[:1])
    for slot in it.ahead.window:  # the window's fetches done: their ranges staged
        for fetched in slot.fetches:
            fetched.result()
    assert stage.stats.held > 0, "the next batches' samples were staged"
    it.close()
    assert stage.stats.held == 0
    rest = list(loader)  # the next pass: every sample, its bytes fetched again where needed
    ids = torch.cat([y for _, y in rest]).tolist()
    assert sorted(ids) == list(range(len(local)))
    for x, y in rest:
        for row, i in zip(x, y.tolist(), strict=True):
            assert torch.equal(row, torch.as_tensor(local[i][0]))


def test_over_s3_equal_and_resumable(s3: S3Server, local: PickleDataset) -> None:
    ds = PickleDataset("s3://loader/ids/", storage_options=s3.options())
    s3.traffic.reset()
    _check(
        list(Loader(ds, 16, sampler=ShuffleSampler(ds, seed=2), prefetch=4)), _want(local, 2, 16)
    )
    assert s3.traffic.gets <= len(ds) + 2 * len(SIZES)

    def make() -> Loader:
        return Loader(ds, 16, sampler=ShuffleSampler(ds, seed=3), prefetch=3)

    check_loader_resume(make, stops=[2, 7])
