"""``pickleshard profile DATA``: where a training epoch's data time goes, and what would help.

Opens DATA as a :class:`~pickleshard.PickleDataset`, runs ``--batches`` batches of a shuffled
epoch through :class:`~pickleshard.Loader` with the given settings (the training loop does
nothing), and prints the loader's per-stage table (:func:`pickleshard.loading.stats_table`:
waiting for reads, reading + decoding, transform, collating, the loop itself; reads and bytes in
flight) with the one setting most likely to help (:func:`pickleshard.loading.advice`). ``--json``
prints the counters and the advice as one JSON object.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..dataset import PickleDataset
from ..io.remote.source import is_url
from ..loading import Loader, advice, stats_table
from . import COMMANDS
from ._common import add_safety_flags, safety_kwargs, show_progress, storage_options


def run(args: argparse.Namespace) -> int:
    ds = PickleDataset(
        args.data,
        index=args.index,
        storage_options=storage_options(args),
        progress=show_progress(args),
        **safety_kwargs(args),  # type: ignore[arg-type]
    )
    loader = Loader(
        ds,
        args.batch_size,
        prefetch=args.prefetch,
        threads=args.threads,
        workers=args.workers,
        seed=args.seed,
    )
    bar: Any = None
    if show_progress(args):
        from tqdm.auto import tqdm

        bar = tqdm(total=min(args.batches, len(loader)), unit="batch", leave=False)
    for k, _ in enumerate(loader, 1):
        if bar is not None:
            bar.update()
        if k >= args.batches:
            break
    if bar is not None:
        bar.close()
    stats = loader.stats
    remote = is_url(ds.source.root)
    whole = sum(m == "whole" for m in ds.file_modes)
    tip = advice(stats, remote=remote, whole_files=whole)
    if args.json:
        out = {"data": args.data, "remote": remote, **stats.as_json(), "advice": tip}
        print(json.dumps(out, indent=1))
        return 0
    print(f"{args.data}: {len(ds)} samples in {len(ds.file_modes)} files ({whole} read whole)")
    print("\n".join(stats_table(stats)))
    print(f"\nmost likely to help: {tip}")
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("profile", help=COMMANDS["profile"], description=__doc__)
    s.add_argument("data", help="directory, glob, file or URL of pickles (as PickleDataset takes)")
    s.add_argument("--index", help="index directory (default: DATA/.pickleshard)")
    s.add_argument("--batches", type=int, default=300, help="batches to run (default 300)")
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--prefetch", type=int, default=8, help="batches kept in flight")
    s.add_argument(
        "--threads",
        type=int,
        default=None,
        help="reading threads (default: prefetch for remote files, 0 for local ones: read in "
        "the loop's thread)",
    )
    s.add_argument(
        "--workers", type=int, default=0, help="worker processes (default 0: threads read)"
    )
    s.add_argument("--seed", type=int, default=0, help="the shuffle's seed")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_safety_flags(s)
    s.set_defaults(handler=run)
