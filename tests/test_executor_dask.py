"""The Dask executor on a real 2-worker ``LocalCluster`` (processes, 127.0.0.1), one per module.

Index, convert and verify through the cluster give the local executor's result byte for byte; a
worker that dies mid-conversion is survived with a complete, identical output; the CLI's
``--executor dask=ADDRESS`` works end to end; ``executor="dask"`` starts a cluster and closes
it; an unreachable scheduler is one clear error naming its address.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from pickleshard.cli import main
from pickleshard.dataset import PickleDataset
from pickleshard.errors import (
    ClusterUnreachableError,
    NotAPickleError,
    UnencodableValueError,
    VerifyMismatchError,
)
from pickleshard.executors.dask import DaskExecutor
from pickleshard.indexing.build import build_index
from pickleshard.pipelines.convert.run import convert
from pickleshard.pipelines.synth import write_synthetic
from pickleshard.pipelines.verify.run import verify
from pickleshard.testing import write_files

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # its HTTP server: loopback, any free port
        scheduler_kwargs={"dashboard": False},
    )
    client = distributed.Client(cluster, set_as_default=False)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dask") / "data"
    write_synthetic(root, files=6, per_file=8, shape=(4, 3))
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {
        os.fspath(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _index_tree(root: Path) -> dict[str, bytes]:
    """An index's files, with the build's random array-name token and the per-process count
    of bytes storage delivered (a property of the page cache, not of the index) blanked."""
    token = re.search(rb'"samples-([0-9a-f]+)\.npy"', (root / "index.json").read_bytes())
    assert token is not None
    out = {}
    for name, data in _tree(root).items():
        data = data.replace(token.group(1), b"TOKEN")
        if name == "index.json":
            data = re.sub(rb'"bytes_fetched": \d+', b'"bytes_fetched": 0', data)
        out[name.replace(token.group(1).decode(), "TOKEN")] = data
    return out


def test_index_through_the_cluster_is_byte_identical(
    client: Any, data: Path, tmp_path: Path
) -> None:
    build_index(data, index=tmp_path / "local", jobs=1)
    build_index(data, index=tmp_path / "dask", executor=client)
    assert _index_tree(tmp_path / "dask") == _index_tree(tmp_path / "local")


@pytest.mark.parametrize("to", ["memmap", "lmdb", "webdataset"])
def test_convert_through_the_cluster_is_byte_identical(
    client: Any, data: Path, tmp_path: Path, to: str
) -> None:
    convert(data, tmp_path / "local", to=to, jobs=1)
    report = convert(data, tmp_path / "dask", to=to, executor=client, verify=True)
    assert report.verified == report.num_samples == 48
    assert _tree(tmp_path / "dask") == _tree(tmp_path / "local")


def test_verify_through_the_cluster_gives_the_same_report(client: Any, tmp_path: Path) -> None:
    n = 700  # three runs of verify
    write_files(tmp_path / "src", [([float(k) for k in range(n)], list(range(n)))])
    convert(tmp_path / "src", tmp_path / "out", jobs=1)
    want, got = (
        verify(tmp_path / "src", tmp_path / "out"),
        verify(tmp_path / "src", tmp_path / "out", executor=client),
    )
    assert (got.out, got.checked, got.total, got.against) == (
        want.out,
        want.checked,
        want.total,
        want.against,
    )
    changed = list(range(n))
    changed[650] = changed[300] = -1
    write_files(tmp_path / "changed", [([float(k) for k in range(n)], changed)])
    with pytest.raises(VerifyMismatchError) as local:
        verify(tmp_path / "changed", tmp_path / "out")
    with pytest.raises(VerifyMismatchError) as remote:
        verify(tmp_path / "changed", tmp_path / "out", executor=client)
    assert str(remote.value) == str(local.value)
    assert remote.value.sample == 300


def test_a_bad_value_on_a_worker_is_the_local_error(client: Any, tmp_path: Path) -> None:
    from pickleshard.testing.formats import WritesUnpicklable

    write_files(tmp_path / "src", [([1, 2], [3, 4]), ([5, 6], [7, WritesUnpicklable()])])
    with pytest.raises(UnencodableValueError) as local:
        convert(tmp_path / "src", tmp_path / "local", jobs=1, trusted=True)
    with pytest.raises(UnencodableValueError) as remote:
        convert(tmp_path / "src", tmp_path / "dask", executor=client, trusted=True)
    assert str(remote.value) == str(local.value)
    assert (remote.value.path, remote.value.sample) == (local.value.path, 3)
    assert not (tmp_path / "dask").exists()
    (bad := tmp_path / "src" / "part-001.pkl").write_bytes(b"not a pickle")
    with pytest.raises(NotAPickleError, match=re.escape(str(bad.resolve()))):
        build_index(tmp_path / "src", index=tmp_path / "index", executor=client)


def _die_once(marker: str, at: int, sample: Any) -> Any:
    """A transform that kills its worker process (no cleanup, no exception) the first time it
    sees the sample whose label is ``at``; the marker file says it has happened."""
    if sample[1] == at:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return sample
        os._exit(17)
    return sample


def test_a_worker_killed_mid_conversion_is_survived(
    client: Any, data: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "died"
    dying = partial(_die_once, os.fspath(marker), 5)  # synth labels are < 10: mid-part
    marker.touch()  # disarmed for the reference run, in this process
    convert(PickleDataset(data, transform=dying), tmp_path / "local", jobs=1)
    marker.unlink()  # armed: the first worker to reach a sample labelled 5 dies
    convert(
        PickleDataset(data, transform=dying),
        tmp_path / "dask",
        executor=client,
        memory_bytes=1,  # one sample per batch: the part is half written when its worker dies
    )
    assert marker.exists()  # a worker did die
    assert _tree(tmp_path / "dask") == _tree(tmp_path / "local")
    assert not (tmp_path / ".dask.partial").exists()


def test_the_cli_runs_on_a_cluster_by_address(
    client: Any, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"dask={client.scheduler.address}"
    index = tmp_path / "index"
    assert main(["index", os.fspath(data), "--index", os.fspath(index), "--executor", address]) == 0
    out = tmp_path / "out"
    args = ["convert", os.fspath(data), os.fspath(out), "--executor", address, "--json"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["verify", os.fspath(data), os.fspath(out), "--executor", address, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["checked"], report["against"]) == (48, "source")
    convert(data, tmp_path / "local", jobs=1)
    assert _tree(out) == _tree(tmp_path / "local")


def test_the_cli_starts_a_local_cluster_and_closes_it(data: Path, tmp_path: Path) -> None:
    """``python -m pickleshard index --executor dask``: a LocalCluster of --jobs spawned
    workers, an index equal to the local one, and no process of the cluster left once the
    command has exited."""
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "I15_CLUSTER_MARK": mark}
    index = tmp_path / "index"
    cmd = [sys.executable, "-m", "pickleshard", "index", os.fspath(data), "--index"]
    cmd += [os.fspath(index), "--executor", "dask", "--jobs", "2", "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["samples"] == 48
    build_index(data, index=tmp_path / "local", jobs=1)
    assert _index_tree(index) == _index_tree(tmp_path / "local")
    left = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("I15_CLUSTER_MARK") == mark:
                left.append(proc)
    assert left == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_an_unreachable_scheduler_is_one_clear_error(data: Path, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    with pytest.raises(ClusterUnreachableError, match=re.escape(address)) as info:
        build_index(data, index=tmp_path / "i", executor=DaskExecutor(address, connect_timeout=1))
    assert "cannot connect within 1 s" in str(info.value)
    assert isinstance(info.value, ConnectionError)


def test_a_remote_dataset_indexes_on_the_cluster(client: Any, data: Path, tmp_path: Path) -> None:
    """The workers open s3:// objects with the storage options given to the build here (they
    travel inside each task: nothing is registered on the workers), and the index is the local
    executor's; a dataset over it reads with its own options."""
    from pickleshard.testing.servers import S3Server

    server = S3Server().start()
    try:
        files = {f"data/{p.name}": p.read_bytes() for p in sorted(data.glob("*.pkl"))}
        server.upload("dask-bucket", files)
        url = "s3://dask-bucket/data/"
        local = PickleDataset(
            url, index=tmp_path / "local", storage_options=server.options(), jobs=1
        )
        options = server.options()
        build_index(url, index=tmp_path / "dask", executor=client, storage_options=options)
        assert _index_tree(tmp_path / "dask") == _index_tree(tmp_path / "local")
        remote = PickleDataset(
            url, index=tmp_path / "dask", rebuild="never", storage_options=options
        )
        assert [remote[i][1] for i in range(len(remote))] == [
            local[i][1] for i in range(len(local))
        ]
    finally:
        server.stop()
