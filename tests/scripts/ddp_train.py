"""One epoch of DistributedDataParallel training per sampler; each rank logs the ids it saw.

Launched by ``tests/test_ddp.py`` as ``torchrun --standalone --nproc_per_node=2 ddp_train.py``
(gloo backend, CPU), over local files or an ``s3://`` prefix (reached through the standard AWS
environment variables, as a user's job would). The data's ``y`` is each sample's global index. Rank ``r`` writes
``OUT/{sampler}-rank{r}.json``: ``{"ids": [...], "weights": [...]}``, the ids in the order it
trained on them and the model's weights after the epoch (equal on all ranks if DDP synced).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from pickleshard.dataset import PickleDataset
from pickleshard.samplers import BlockShuffleSampler, ShuffleSampler


def sampler_for(kind: str, ds: PickleDataset, batch_size: int, workers: int) -> Any:
    # rank and world size come from torch.distributed, as in a user's script.
    if kind == "shuffle":
        return ShuffleSampler(ds, seed=1)
    return BlockShuffleSampler(ds, batch_size=batch_size, num_workers=workers, seed=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="a directory or an s3:// prefix")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = PickleDataset(args.data, cache_bytes=1 << 16)
    for kind in ("shuffle", "block"):
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        optim = torch.optim.SGD(model.parameters(), lr=1e-3)
        sampler = sampler_for(kind, ds, args.batch_size, args.workers)
        sampler.set_epoch(0)
        loader = DataLoader(
            ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers
        )
        ids: list[int] = []
        for x, y in loader:
            loss = ((model(x).squeeze(1) - y.float() / len(ds)) ** 2).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            ids += y.tolist()
        weights = [float(v) for p in model.parameters() for v in p.detach().flatten()]
        record = {"ids": ids, "weights": weights}
        (args.out / f"{kind}-rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
