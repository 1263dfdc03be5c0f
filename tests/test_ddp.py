"""DDP: ``torchrun --standalone --nproc_per_node=2`` (gloo, CPU) over a PickleDataset, of
local files and of the same files in S3 (moto's server on 127.0.0.1).

Each rank trains a tiny DistributedDataParallel model for one epoch with each sampler and logs
the sample ids it saw (the data's ``y`` is the global index); together the ranks must cover the
epoch exactly once, each in the order its sampler gives, with DDP keeping the weights in sync.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pickleshard.dataset import PickleDataset
from pickleshard.samplers import BlockShuffleSampler, ShuffleSampler
from pickleshard.testing.resume import write_id_files

SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"
SIZES = [7, 12, 1, 9, 11]  # 40 samples: 20 per rank, no padding


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_ranks_cover_the_epoch_exactly_once(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    n = write_id_files(data, SIZES)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = None
    source = str(data)
    if where == "s3":
        from pickleshard.testing.servers import S3Server

        server = S3Server().start()
        server.upload("ddp", {f"ids/{p.name}": p.read_bytes() for p in sorted(data.iterdir())})
        source = "s3://ddp/ids/"
        shutil.rmtree(data)  # the ranks can read the bucket only
        remote_env = {
            "AWS_ENDPOINT_URL": server.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "eu-west-1",
            "PICKLESHARD_INDEX_HOME": str(tmp_path / "index-home"),
        }
        env.update(remote_env)
        for key, value in remote_env.items():
            monkeypatch.setenv(key, value)
    try:
        ds = PickleDataset(source)  # index once here, not racily on both ranks
        out.mkdir()
        with open(tmp_path / "log.txt", "w") as log:
            proc = subprocess.run(
                [
                    *_torchrun(),
                    *("--standalone", "--nproc_per_node=2", str(SCRIPT)),
                    *("--data", source, "--out", str(out), "--workers", "1"),
                ],
                stdout=log,
                stderr=log,
                env=env,
                timeout=180,
            )
    finally:
        if server is not None:
            server.stop()
    assert proc.returncode == 0, (tmp_path / "log.txt").read_text()[-4000:]

    for kind in ("shuffle", "block"):
        ranks = [json.loads((out / f"{kind}-rank{r}.json").read_text()) for r in range(2)]
        ids = [r["ids"] for r in ranks]
        assert len(ids[0]) == len(ids[1]) == n // 2, kind
        assert sorted(ids[0] + ids[1]) == list(range(n)), f"{kind}: each sample exactly once"
        assert ranks[0]["weights"] == ranks[1]["weights"], f"{kind}: DDP kept the ranks in sync"
        for rank, seen in enumerate(ids):
            sampler = (
                ShuffleSampler(ds, seed=1, rank=rank, world_size=2)
                if kind == "shuffle"
                else BlockShuffleSampler(
                    ds, batch_size=4, num_workers=1, seed=1, rank=rank, world_size=2
                )
            )
            assert seen == list(sampler), f"{kind}: rank {rank} follows its sampler"
