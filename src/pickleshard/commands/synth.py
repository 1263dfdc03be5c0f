"""``pickleshard synth``: write a synthetic dataset of seed-layout pickle files."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..pipelines.synth import write_synthetic
from . import COMMANDS


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be comma-separated integers, got {text!r}"
        ) from None
    if any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"shape dimensions must be >= 0, got {text!r}")
    return dims


def run(args: argparse.Namespace) -> int:

    t0 = time.perf_counter()
    paths = write_synthetic(
        args.out,
        files=args.files,
        per_file=args.per_file,
        shape=args.shape,
        kind=args.kind,
        protocol=args.protocol,
        seed=args.seed,
    )
    size = sum(p.stat().st_size for p in paths)
    print(
        f"wrote {len(paths)} files, {len(paths) * args.per_file} samples, "
        f"{size / (1 << 20):.1f} MiB to {args.out} in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("synth", help=COMMANDS["synth"])
    s.add_argument("out", help="output directory")
    s.add_argument("--files", type=int, default=8)
    s.add_argument("--per-file", type=int, default=1000)
    s.add_argument("--shape", type=_shape, default=(3, 32, 32), help="x shape, e.g. 3,32,32")
    s.add_argument("--kind", choices=("arrays", "objects"), default="arrays")
    s.add_argument("--protocol", type=int, choices=range(6), default=5)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(handler=run)
