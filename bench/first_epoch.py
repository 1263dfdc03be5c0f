"""``python -m bench first-epoch``: whole-file mode's first shuffled epoch against the folk Dataset.

The issue's target, measured side by side in one run: ``PickleDataset(d, mode="whole")`` with
:class:`~pickleshard.BlockShuffleSampler` (shuffled; its first epoch unpickles every file once)
against the folk JSON Dataset's sequential epoch (which also unpickles every file once), both
through ``DataLoader(batch_size=64, num_workers=0)`` on the same seed-layout files.

Each row runs in a fresh process that first builds its dataset's index (the folk JSON index, or
``build_index(spans=False)``: each unpickles every file once, untimed), then times one epoch.
The two kinds alternate ``--repeat`` times so that machine noise falls on both. Reported per
kind: the median and best wall time, and the median CPU time of the row's process
(``time.process_time``), which a busy machine disturbs far less than wall time.

``--profile`` then runs one epoch of each kind under ``cProfile`` (CPU time) in this process and
prints where each spends its time beyond ``pickle.load``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .data import DataSpec, ensure_data
from .measure import MiB

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
KINDS = ("folk", "whole")
EXTRA = ("whole-seq", "whole-one")
NAMES = {
    "folk": "folk JSON Dataset, sequential",
    "whole": "PickleDataset whole + BlockShuffleSampler, first shuffled",
    "whole-seq": "PickleDataset whole, sequential (no shuffle: the folk row's order)",
    "whole-one": "PickleDataset whole + BlockShuffleSampler, cache of one file (memory reused)",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench first-epoch", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--per-file", type=int, default=2500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5, help="rows of each kind, alternating")
    p.add_argument("--cache-bytes", type=int, default=256 * MiB, help="whole-file cache budget")
    p.add_argument("--data", type=Path, default=HERE / "data", help="where synthetic data is kept")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads in each row (0: torch's default). One by default: the "
        "batch's consumption is the same in both rows, and on a busy machine its thread "
        "pool's contention would swamp the data path being compared",
    )
    p.add_argument("--profile", action="store_true", help="also profile one whole-file epoch")
    p.add_argument(
        "--floor",
        action="store_true",
        help="also the rows that locate the floor: whole-file mode read sequentially (the folk "
        "row's order), and shuffled with a cache of one file (the folk row's memory reuse)",
    )
    return p


def _build(kind: str, data: DataSpec, args: argparse.Namespace) -> tuple[Any, Any]:
    """The row's dataset and sampler, its index built (every file unpickled once, untimed)."""
    from torch.utils.data import SequentialSampler

    from pickleshard import BlockShuffleSampler, PickleDataset, build_index

    from .baselines import FolkJsonDataset, write_folk_index

    if kind == "folk":
        write_folk_index(data.paths, data.folk_index)
        folk = FolkJsonDataset(data.folk_index)
        return folk, SequentialSampler(folk)
    shutil.rmtree(data.directory / ".pickleshard", ignore_errors=True)
    build_index(data.directory, spans=False)
    budget = args.cache_bytes
    if kind == "whole-one":  # one decoded file at a time, as the folk Dataset keeps
        from pickleshard import open_index

        budget = max(f.decoded_nbytes for f in open_index(data.directory)[0].files)
    ds = PickleDataset(data.directory, mode="whole", cache_bytes=budget, rebuild="never")
    if kind == "whole-seq":
        return ds, SequentialSampler(ds)
    return ds, BlockShuffleSampler(ds, batch_size=args.batch_size, cache_bytes=budget)


def _loads(dataset: Any) -> int:
    stats = getattr(dataset, "cache_stats", None)
    return int(stats.loads if stats is not None else dataset.file_loads)


def _row(kind: str, data: DataSpec, args: argparse.Namespace) -> dict[str, float]:
    """Build, then time one epoch in this process (``--child``)."""
    import gc

    import torch

    from .epoch import run_epoch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    dataset, sampler = _build(kind, data, args)
    gc.collect()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu = time.process_time()
    # memory sampled on entry and exit only: a sampling thread would add CPU time to the row
    epoch = run_epoch(dataset, sampler, batch_size=args.batch_size, workers=0, memory_interval=1e6)
    return {
        "seconds": epoch.seconds,
        "cpu_seconds": time.process_time() - cpu,
        "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
        "samples": epoch.samples,
        "loads": _loads(dataset),
    }


def _run_isolated(kind: str, argv: list[str]) -> dict[str, float]:
    repo_root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.first_epoch", "--child", kind, *argv],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    out: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _profile(kind: str, args: argparse.Namespace, data: DataSpec) -> str:
    """The top of a CPU-time profile (``time.process_time``) of one ``kind`` epoch."""
    import torch

    from .epoch import run_epoch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    ds, sampler = _build(kind, data, args)
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    run_epoch(ds, sampler, batch_size=args.batch_size, workers=0, memory_interval=1e6)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(16)
    return f"CPU profile, {NAMES[kind]}:\n{out.getvalue()}"


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    child = given[1] if given[:1] == ["--child"] else None
    rest = given[2:] if child else given
    args = _parser().parse_args(rest)
    data = DataSpec(args.data, args.files, args.per_file, (3, 32, 32))
    if child is not None:
        print(json.dumps(_row(child, data, args)))
        return 0
    if ensure_data(data):
        print(f"wrote {data.directory}", flush=True)
    size = sum(p.stat().st_size for p in data.paths)
    print(
        f"{data.num_samples:,} float32 (3x32x32 = 12 KB) samples in {data.files} files of "
        f"pickle.dump((x_list, y_list)), {size / MiB:,.0f} MiB; batch {args.batch_size}, "
        f"num_workers=0, torch threads {args.torch_threads or 'default'}, a fresh process per "
        f"row; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    kinds = KINDS + EXTRA if args.floor else KINDS
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for r in range(args.repeat):
        for kind in kinds:
            row = _run_isolated(kind, rest)
            print(
                f"  run {r}: {kind:5} {row['seconds']:6.3f} s wall, {row['cpu_seconds']:6.3f} s "
                f"CPU, {row['samples']:,} samples, {row['loads']} file loads, "
                f"{row['minor_faults']:,} minor page faults",
                flush=True,
            )
            rows[kind].append(row)

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[kind])

    best = {k: min(r["seconds"] for r in rows[k]) for k in kinds}
    print()
    print("| epoch | median wall s | best wall s | median CPU s | folk / this, median CPU |")
    print("|---|---|---|---|---|")
    for k in kinds:
        print(
            f"| {NAMES[k]} | {med(k, 'seconds'):.3f} | {best[k]:.3f} | {med(k, 'cpu_seconds'):.3f} "
            f"| {med('folk', 'cpu_seconds') / med(k, 'cpu_seconds'):.2f}x |"
        )
    print()
    print(
        "whole first epoch / folk sequential, speed ratio (target >= 0.9x): "
        f"median wall {med('folk', 'seconds') / med('whole', 'seconds'):.2f}x, "
        f"best wall {best['folk'] / best['whole']:.2f}x, "
        f"median CPU {med('folk', 'cpu_seconds') / med('whole', 'cpu_seconds'):.2f}x; "
        f"load average at end {os.getloadavg()[0]:.1f}"
    )
    if args.profile:
        for kind in KINDS:
            print(_profile(kind, args, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
