"""``pickleshard demo``: synthesise ~200 MB, index it, train a tiny model for one epoch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..pipelines.demo import DemoConfig, run_demo
from . import COMMANDS


def run(args: argparse.Namespace) -> int:

    cfg = DemoConfig(
        data_dir=Path(args.dir), files=args.files, per_file=args.per_file, num_workers=args.workers
    )
    run_demo(cfg)
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("demo", help=COMMANDS["demo"])
    s.add_argument("--dir", default="demo-data")
    s.add_argument("--files", type=int, default=8)
    s.add_argument("--per-file", type=int, default=2000)
    s.add_argument("--workers", type=int, default=2)
    s.set_defaults(handler=run)
