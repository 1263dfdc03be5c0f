"""``pickleshard verify``: compare a conversion with its source, or with its stored digests."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..pipelines.mixed import recorded_mix
from ..pipelines.verify.run import verify
from . import COMMANDS
from ._common import (
    add_executor_flag,
    add_layout_flag,
    add_safety_flags,
    safety_kwargs,
    show_progress,
    storage_options,
)


def run(args: argparse.Namespace) -> int:

    *sources, out = args.paths
    if (
        len(sources) > 1 and recorded_mix(out, strict=False) is None
    ):  # several sources: only a mix's
        args.parser.error(
            f"verify takes [SRC] OUT (SRC... OUT for a mix), got {len(args.paths)} paths"
        )
    source = sources if len(sources) > 1 else sources[0] if sources else None
    report = verify(
        source,
        out,
        sample=args.sample,
        seed=args.seed,
        jobs=args.jobs,
        executor=args.executor,
        progress=show_progress(args),
        layout=args.layout,
        storage_options=storage_options(args),
        **safety_kwargs(args),  # type: ignore[arg-type]
    )
    if args.json:
        summary = {
            "out": str(report.out),
            "checked": report.checked,
            "total": report.total,
            "against": report.against,
            "seconds": round(report.seconds, 3),
        }
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"ok: {report.checked} of {report.total} samples of {report.out} match the "
            f"{report.against} ({report.seconds:.2f} s)"
        )
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser(
        "verify",
        help=COMMANDS["verify"],
        usage="pickleshard verify [-h] [SRC...] OUT [--sample K] [--seed S] [--jobs N] "
        "[--executor E] [--json]",
    )
    s.add_argument("paths", nargs="+", metavar="[SRC...] OUT")
    s.add_argument("--sample", type=int, default=None, metavar="K", help="check K random samples")
    s.add_argument("--seed", type=int, default=0, help="seed for --sample")
    s.add_argument(
        "--jobs", type=int, default=None, help="runs of samples checked at once (default 1)"
    )
    s.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    add_executor_flag(s)
    add_safety_flags(s)
    add_layout_flag(s)
    s.set_defaults(handler=run, parser=s)
