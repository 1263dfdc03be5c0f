"""``python -m bench.whole_workers``: a big file read whole, with DataLoader workers (issue 14).

One protocol-2 pickle of a CIFAR-like bytes-keyed dict, ``{b"data": uint8 (N, 3072),
b"labels": [int] * N}`` (``--mib``: the file's size; ``--full`` is the issue's 431 MB), read
through ``DataLoader(batch_size, shuffle=True, num_workers=2)`` by:

- ``naive``: the Dataset people write: ``pickle.load`` in ``__init__``, then the DataLoader
  forks its workers, which share the loaded pages (copy-on-write; the array's pages are never
  written, so they stay shared).
- ``pickleshard``: ``PickleDataset(d, mode="whole", cache_bytes=32 MiB)``, its index built
  beforehand (in another process, untimed) and its whole-file cache entries removed, so the
  epoch starts cold: a worker decodes the file once into ``<index>/whole`` and both map it.
- ``pickleshard-unshared`` (with ``--unshared``): the same, with the mapped cache turned off
  (each worker decodes and holds its own copy): what the issue measured.
- ``pickleshard-first-use`` (with ``--first-use``): ``PickleDataset(folder, cache_bytes=...)``
  with no index yet, in the default mode: the row builds the index, as a user's first run does.

Each kind runs in a fresh process. Peak PSS of its process tree (main + workers, psutil
``memory_full_info`` every ``--interval`` s) is sampled from this process, over the row's whole
life (the common part: the interpreter and torch); the row's own in-process sampler is shown
too: its thread cannot run while ``pickle.load`` holds the GIL, so it misses the naive load's
peak (how the issue's naive figure was low). The row's time covers the dataset's construction
and the epoch;
the time is construction plus one epoch (the naive load is in its construction, pickleshard's
decode in its epoch). The kinds alternate ``--repeat`` times. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from .measure import MiB, PeakTreeMemory, tree_memory

__all__ = ["main", "write_cifar_like"]

HERE = Path(__file__).resolve().parent
ROW = 3072
FULL_MIB = 411  # 431 MB: the file
KINDS = ("naive", "pickleshard")


def write_cifar_like(path: Path, rows: int, seed: int = 0) -> None:
    """``{b"data": uint8 (rows, 3072), b"labels": [int]}`` as ``pickle.dump(protocol=2)`` (numpy
    writes a protocol-2 array's bytes as latin-1 text: the file is ~1.5x the array)."""
    rng = np.random.default_rng(seed)
    obj = {
        b"data": rng.integers(0, 256, size=(rows, ROW), dtype=np.uint8),
        b"labels": [int(v) for v in rng.integers(0, 10, size=rows)],
    }
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)
    os.replace(tmp, path)


def _rows_for(mib: float) -> int:
    return max(64, int(mib * MiB / (ROW * 1.5 + 2)))


def ensure_file(root: Path, mib: float) -> Path:
    directory = root / f"cifar-like-p2-{mib:g}mib"
    path = directory / "data_batch.pkl"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        write_cifar_like(path, _rows_for(mib))
    return path


class NaiveDataset:
    """``pickle.load`` up front; the forked workers share the result."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as fh:
            obj = pickle.load(fh)
        self.data, self.labels = obj[b"data"], obj[b"labels"]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.data[i], self.labels[i]


def _dataset(kind: str, path: Path, cache_bytes: int) -> Any:
    if kind == "naive":
        return NaiveDataset(path)
    from pickleshard import PickleDataset

    if kind == "pickleshard-first-use":  # what a user writes: the index is built here
        return PickleDataset(path.parent, cache_bytes=cache_bytes)
    return PickleDataset(path.parent, mode="whole", cache_bytes=cache_bytes, rebuild="never")


def _row(kind: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    if kind == "pickleshard-unshared":
        import pickleshard.dataset as dsmod

        setattr(dsmod, "whole_loader", lambda load, *a: load)  # noqa: B010 - off, for this row
    samples = 0
    with PeakTreeMemory(args.interval) as mem:
        t0 = time.perf_counter()
        ds = _dataset(kind, path, args.cache_bytes)
        built = time.perf_counter() - t0
        g = torch.Generator().manual_seed(0)
        loader = DataLoader(
            ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, generator=g
        )
        for _ in range(args.epochs):
            for xb, _ in loader:
                samples += int(xb.shape[0])
        seconds = time.perf_counter() - t0
    return {
        "kind": kind,
        "peak_pss": mem.peak_pss,
        "start_pss": mem.start.pss,
        "seconds": seconds,
        "construct_seconds": built,
        "samples": samples,
    }


def _watch(proc: subprocess.Popen[str], interval: float) -> int:
    """Peak PSS of ``proc`` and its descendants, sampled from this process until it exits.

    From outside, because a sampling thread inside the row's process cannot run while the C
    unpickler holds the GIL: the naive row's whole load would be invisible to it."""
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, tree_memory(proc.pid).pss)
        time.sleep(interval)
    return peak


def _prepare(kind: str, path: Path) -> None:
    """Index built (untimed, in this process) and whole-file cache entries removed: cold; for
    ``pickleshard-first-use``, no index at all (the row builds it)."""
    if kind == "pickleshard-first-use":
        shutil.rmtree(path.parent / ".pickleshard", ignore_errors=True)
    elif kind.startswith("pickleshard"):
        from pickleshard import build_index

        index = path.parent / ".pickleshard"
        if not (index / "index.json").exists():
            build_index(path.parent)
        shutil.rmtree(index / "whole", ignore_errors=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.whole_workers", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--mib", type=float, default=48, help="file size in MiB (default 48)")
    p.add_argument("--full", action="store_true", help=f"the issue's file: {FULL_MIB} MiB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--cache-bytes", type=int, default=32 * MiB)
    p.add_argument("--repeat", type=int, default=1, help="rows of each kind, alternating")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between PSS samples")
    p.add_argument("--unshared", action="store_true", help="also the unshared worker caches")
    p.add_argument(
        "--first-use",
        action="store_true",
        help="also PickleDataset(folder, cache_bytes=...) with no index yet, default mode: the "
        "index is built in the row, as on a user's first run",
    )
    p.add_argument("--data", type=Path, default=HERE / "data")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    mib = FULL_MIB if args.full else args.mib
    path = ensure_file(args.data, mib)
    if args.child:
        print(json.dumps(_row(args.child, path, args)))
        return 0
    kinds = [*KINDS, *(["pickleshard-unshared"] if args.unshared else [])]
    kinds += ["pickleshard-first-use"] if args.first_use else []
    rest = list(sys.argv[1:] if argv is None else argv)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])
        ),
    }
    size = path.stat().st_size
    print(
        f"{path.name}: {size / 1e6:.0f} MB protocol-2 dict, {_rows_for(mib):,} rows of 3072 uint8; "
        f"batch {args.batch_size}, shuffle, num_workers={args.workers}, {args.epochs} epoch(s), "
        f"cache_bytes={args.cache_bytes / MiB:g} MiB; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs",
        flush=True,
    )
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(args.repeat):
        for kind in kinds:
            _prepare(kind, path)
            cmd = [sys.executable, "-m", "bench.whole_workers", *rest, "--child", kind]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
            outside = _watch(proc, args.interval)
            row = json.loads(proc.stdout.read().strip().splitlines()[-1])  # type: ignore[union-attr]
            if proc.wait():
                raise SystemExit(f"{kind} row failed")
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            row["outside_pss"] = outside
            # user + system CPU of the row, its workers included (reaped): robust to a busy machine
            row["cpu_seconds"] = (after.ru_utime + after.ru_stime) - (
                before.ru_utime + before.ru_stime
            )
            rows[kind].append(row)
            print(
                f"  run {r}: {kind:20} peak PSS {outside / 1e6:6.0f} MB sampled from outside, "
                f"{row['peak_pss'] / 1e6:6.0f} MB from inside; {row['seconds']:6.2f} s, "
                f"{row['cpu_seconds']:6.2f} s CPU "
                f"({row['construct_seconds']:.2f} s constructing), {row['samples']:,} samples",
                flush=True,
            )

    def med(kind: str, key: str) -> float:
        return float(statistics.median(r[key] for r in rows[kind]))

    print()
    print(
        "| dataset | peak PSS main + workers, MB (sampled from outside) | vs naive "
        "| same, sampled inside the main process | time s | vs naive | CPU s, all processes "
        "| vs naive |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        pss, inside, secs = med(kind, "outside_pss"), med(kind, "peak_pss"), med(kind, "seconds")
        print(
            f"| {kind} | {pss / 1e6:.0f} | {pss / med('naive', 'outside_pss'):.2f}x "
            f"| {inside / 1e6:.0f} | {secs:.2f} | {secs / med('naive', 'seconds'):.2f}x "
            f"| {med(kind, 'cpu_seconds'):.2f} "
            f"| {med(kind, 'cpu_seconds') / med('naive', 'cpu_seconds'):.2f}x |"
        )
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
