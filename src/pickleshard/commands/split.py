"""``pickleshard split``: cut one big pickle into chunk pickles of the same layout."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..pipelines.split.run import split
from . import COMMANDS
from ._common import add_safety_flags, parse_size, safety_kwargs


def run(args: argparse.Namespace) -> int:

    if args.max_bytes is None and args.max_samples is None:
        args.parser.error("give --max-bytes SIZE or --max-samples N (or both)")
    report = split(
        args.source,
        args.out,
        max_bytes=args.max_bytes,
        max_samples=args.max_samples,
        memory_bytes=args.memory_bytes,
        overwrite=args.overwrite,
        **safety_kwargs(args),  # type: ignore[arg-type]
    )
    if args.json:
        summary = {
            "out": str(report.out),
            "chunks": [c.name for c in report.chunks],
            "samples": report.num_samples,
            "chunks_reused": report.chunks_reused,
            "already_done": report.already_done,
            "whole_file": report.whole_file,
            "bytes_written": report.bytes_written,
            "seconds": round(report.seconds, 3),
        }
        print(json.dumps(summary, indent=1))
    elif report.already_done:
        print(f"{report.out} already holds this split ({len(report.chunks)} chunks)")
    else:
        reused = f" ({report.chunks_reused} kept from an interrupted run)"
        print(
            f"split {report.num_samples} samples into {len(report.chunks)} chunks"
            f"{reused if report.chunks_reused else ''}, "
            f"{report.bytes_written / (1 << 20):.1f} MiB in {report.seconds:.2f} s -> {report.out}"
        )
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser(
        "split",
        help=COMMANDS["split"],
        usage="pickleshard split [-h] SOURCE OUT (--max-bytes SIZE | --max-samples N) [options]",
    )
    s.add_argument("source", help="the pickle file to split")
    s.add_argument("out", help="output directory (rerun to resume an interrupted split)")
    s.add_argument(
        "--max-bytes",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="at most this many pickled bytes per chunk, e.g. 1GiB",
    )
    s.add_argument(
        "--max-samples", type=int, default=None, metavar="N", help="at most N samples per chunk"
    )
    s.add_argument(
        "--memory-bytes",
        type=parse_size,
        default=1 << 30,
        metavar="SIZE",
        help="budget for loading a file whole when it cannot be read span by span (default 1GiB)",
    )
    s.add_argument("--overwrite", action="store_true", help="replace a split with other limits")
    s.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    add_safety_flags(s)
    s.set_defaults(handler=run, parser=s)
