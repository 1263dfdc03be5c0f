"""Train a tiny model over id-labelled pickles; checkpoint and SIGKILL itself at given steps.

Run by ``tests/test_resume.py``, once per life: each run resumes from ``--state`` when it exists,
appends one line ``EPOCH ID ID ...`` per batch to ``--seen``, and at the first step of
``--kill-at`` past where it started it saves the checkpoint (atomically) and kills itself with
SIGKILL, so nothing after the checkpoint runs: no ``finally``, no atexit, no worker shutdown.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from pickleshard.dataset import PickleDataset
from pickleshard.samplers import BlockShuffleSampler, ShuffleSampler


def make_sampler(kind: str, ds: PickleDataset, batch_size: int, workers: int, seed: int) -> Any:
    if kind == "shuffle":
        return ShuffleSampler(ds, seed=seed)
    return BlockShuffleSampler(
        ds, batch_size=batch_size, num_workers=workers, seed=seed, cache_bytes=1 << 16
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--sampler", choices=["shuffle", "block"], required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kill-at", type=lambda s: {int(v) for v in s.split(",") if v}, default=set()
    )
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--seen", type=Path, required=True)
    args = parser.parse_args()

    torch.manual_seed(0)
    ds = PickleDataset(args.data, cache_bytes=1 << 16)
    sampler = make_sampler(args.sampler, ds, args.batch_size, args.workers, args.seed)
    loader = StatefulDataLoader(
        ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers
    )
    model = torch.nn.Linear(2, 1)
    optim = torch.optim.SGD(model.parameters(), lr=1e-4)

    first_epoch = step = 0
    if args.state.exists():
        ckpt = torch.load(args.state, weights_only=False)
        first_epoch, step = ckpt["epoch"], ckpt["step"]
        loader.load_state_dict(ckpt["loader"])
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
    started = step

    with open(args.seen, "a") as seen:
        for epoch in range(first_epoch, args.epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = ((model(x).squeeze(1) - y.float() / len(ds)) ** 2).mean()
                optim.zero_grad()
                loss.backward()
                optim.step()
                step += 1
                seen.write(f"{epoch} {' '.join(map(str, y.tolist()))}\n")
                seen.flush()
                if step in args.kill_at and step > started:
                    ckpt = {
                        "epoch": epoch,
                        "step": step,
                        "loader": loader.state_dict(),
                        "model": model.state_dict(),
                        "optim": optim.state_dict(),
                    }
                    tmp = args.state.with_suffix(".tmp")
                    torch.save(ckpt, tmp)
                    os.replace(tmp, args.state)
                    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
