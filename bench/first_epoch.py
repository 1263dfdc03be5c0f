"""``python -m bench first-epoch``: whole-file mode's first shuffled epoch against the folk Dataset.

The issue's target, measured side by side in one run: ``PickleDataset(d, mode="whole")`` with
:class:`~pickleshard.BlockShuffleSampler` (shuffled; its first epoch unpickles every file once)
against the folk JSON Dataset's sequential epoch (which also unpickles every file once), both at
``num_workers=0``, on the same seed-layout files. Each row runs in a fresh process
(:func:`bench.runner.run_isolated`); the two kinds alternate ``--repeat`` times so that machine
noise falls on both, and the table reports the median and the best of each with their ratio.

``--profile`` then runs one whole-file first epoch under ``cProfile`` in this process and prints
where it spends its time beyond ``pickle.load``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
from pathlib import Path

from .data import DataSpec, ensure_data
from .measure import MiB
from .runner import RowResult, RowSpec, run_isolated

__all__ = ["main"]

HERE = Path(__file__).resolve().parent


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench first-epoch", description=__doc__)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--per-file", type=int, default=2500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="rows of each kind, alternating")
    p.add_argument("--cache-bytes", type=int, default=256 * MiB, help="whole-file cache budget")
    p.add_argument("--data", type=Path, default=HERE / "data", help="where synthetic data is kept")
    p.add_argument("--profile", action="store_true", help="also profile one whole-file epoch")
    return p


def _spec(args: argparse.Namespace, data: DataSpec, kind: str) -> RowSpec:
    return RowSpec(
        kind="folk" if kind == "folk" else "pickleshard",
        order="sequential" if kind == "folk" else "shuffled",
        workers=0,
        data_root=str(data.root),
        files=data.files,
        per_file=data.per_file,
        shape=data.shape,
        batch_size=args.batch_size,
        cache_bytes=args.cache_bytes,
        folk_shuffle_cap=data.num_samples,
        seed=data.seed,
    )


def _profile(args: argparse.Namespace, data: DataSpec) -> str:
    from pickleshard import BlockShuffleSampler, PickleDataset

    from .epoch import run_epoch

    ds = PickleDataset(data.directory, mode="whole", cache_bytes=args.cache_bytes)
    sampler = BlockShuffleSampler(ds, batch_size=args.batch_size, cache_bytes=args.cache_bytes)
    prof = cProfile.Profile()
    prof.enable()
    run_epoch(ds, sampler, batch_size=args.batch_size, workers=0)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    data = DataSpec(args.data, args.files, args.per_file, (3, 32, 32))
    if ensure_data(data):
        print(f"wrote {data.directory}", flush=True)
    size = sum(p.stat().st_size for p in data.paths)
    print(
        f"{data.num_samples:,} float32 (3x32x32 = 12 KB) samples in {data.files} files of "
        f"pickle.dump((x_list, y_list)), {size / MiB:,.0f} MiB; batch {args.batch_size}, "
        "num_workers=0, a fresh process per row",
        flush=True,
    )
    results: dict[str, list[RowResult]] = {"folk": [], "whole": []}
    for r in range(args.repeat):
        for kind in results:
            row = run_isolated(_spec(args, data, kind))
            print(f"  run {r}: {kind:5} {row.seconds:6.3f} s, {row.file_loads} file loads")
            results[kind].append(row)
    med = {k: statistics.median(r.seconds for r in rows) for k, rows in results.items()}
    best = {k: min(r.seconds for r in rows) for k, rows in results.items()}
    print()
    print("| epoch | median s | best s | samples/s (median) |")
    print("|---|---|---|---|")
    names = {
        "folk": "folk JSON Dataset, sequential",
        "whole": "PickleDataset whole + BlockShuffleSampler, first shuffled",
    }
    for k in results:
        print(f"| {names[k]} | {med[k]:.3f} | {best[k]:.3f} | {data.num_samples / med[k]:,.0f} |")
    print()
    print(
        f"whole first epoch / folk sequential, speed ratio: median {med['folk'] / med['whole']:.2f}x,"
        f" best {best['folk'] / best['whole']:.2f}x (target >= 0.9x)"
    )
    if args.profile:
        print(_profile(args, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
