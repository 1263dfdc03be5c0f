"""``pickleshard demo``: synthesise a seed-layout dataset, index it, train a tiny model one epoch.

Shows the main job end to end on CPU: samples/s, peak PSS of the whole process tree, and the
cache counters that prove each file was loaded once per worker.
"""

from __future__ import annotations

import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..dataset import PickleDataset
from ..errors import MissingDependencyError
from ..indexing.build import build_index
from ..samplers import BlockShuffleSampler
from .memory import PeakPSS
from .synth import write_synthetic

__all__ = ["DemoConfig", "run_demo"]

MiB = 1 << 20


@dataclass(frozen=True)
class DemoConfig:
    data_dir: Path = Path("demo-data")
    files: int = 8
    per_file: int = 2000
    shape: tuple[int, int, int] = (3, 32, 32)
    batch_size: int = 64
    num_workers: int = 2
    cache_bytes: int = 128 * MiB
    seed: int = 0


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingDependencyError("torch", "torch", "the demo trains a model: it") from None
    return torch


def _tiny_model(torch: Any, channels: int, classes: int) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(8 * 16, classes),
    )


def _dataset(cfg: DemoConfig) -> tuple[PickleDataset, float]:
    expected = cfg.files * cfg.per_file
    try:
        ds = PickleDataset(cfg.data_dir, cache_bytes=cfg.cache_bytes, rebuild="never")
        if len(ds) == expected:
            print(f"reusing {cfg.data_dir} ({len(ds)} samples)")
            return ds, 0.0
    except Exception:  # anything wrong with a leftover folder: make it anew
        pass
    shutil.rmtree(cfg.data_dir, ignore_errors=True)
    t0 = time.perf_counter()
    write_synthetic(
        cfg.data_dir, files=cfg.files, per_file=cfg.per_file, shape=cfg.shape, seed=cfg.seed
    )
    size = sum(p.stat().st_size for p in cfg.data_dir.glob("*.pkl"))
    print(
        f"wrote {cfg.files} files, {expected} samples, {size / MiB:.0f} MiB in {time.perf_counter() - t0:.1f} s"
    )
    t0 = time.perf_counter()
    build_index(cfg.data_dir, progress=True)
    index_s = time.perf_counter() - t0
    print(f"indexed in {index_s:.2f} s")
    return PickleDataset(cfg.data_dir, cache_bytes=cfg.cache_bytes), index_s


def run_demo(cfg: DemoConfig = DemoConfig()) -> dict[str, float]:
    """Run the demo and return its measurements (samples/s, peak PSS MiB, loss)."""
    torch = _torch()
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    ds, _ = _dataset(cfg)
    sampler = BlockShuffleSampler(
        ds, batch_size=cfg.batch_size, num_workers=cfg.num_workers, seed=cfg.seed
    )
    loader = DataLoader(ds, batch_size=cfg.batch_size, sampler=sampler, num_workers=cfg.num_workers)
    model = _tiny_model(torch, cfg.shape[0], 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    seen = 0
    loss = torch.tensor(0.0)
    with PeakPSS() as mem:
        t0 = time.perf_counter()
        for xb, yb in tqdm(loader, desc="epoch 0", unit="batch"):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            seen += len(yb)
        elapsed = time.perf_counter() - t0
    result = {
        "samples": float(seen),
        "seconds": elapsed,
        "samples_per_s": seen / elapsed,
        "start_pss_mib": mem.start_bytes / MiB,
        "peak_pss_mib": mem.peak_bytes / MiB,
        "loss": float(loss.detach()),
    }
    print(
        f"trained 1 epoch: {seen} samples in {elapsed:.1f} s = {result['samples_per_s']:,.0f} samples/s "
        f"(shuffled, {cfg.num_workers} workers, batch {cfg.batch_size}); last loss {result['loss']:.3f}\n"
        f"peak PSS of main + workers: {result['peak_pss_mib']:.0f} MiB "
        f"(before the epoch: {result['start_pss_mib']:.0f} MiB; cache budget {cfg.cache_bytes / MiB:.0f} MiB)"
    )
    print(_where(cfg.data_dir))
    return result


def _where(folder: Path) -> str:
    """Where the demo left its data, how much, and the command that removes it."""
    where = folder.resolve()
    size = sum(p.stat().st_size for p in where.rglob("*") if p.is_file())
    return (
        f"the demo's data and its index are in {where} ({size / MiB:.0f} MiB); "
        f"the next demo reuses them; remove them with: rm -r {shlex.quote(str(where))}"
    )
