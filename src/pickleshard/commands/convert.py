"""``pickleshard convert``: write a pickle dataset as memmap, LMDB, WebDataset, Parquet or Arrow."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..formats.registry import available_formats
from ..pipelines.convert.run import convert
from . import COMMANDS
from ._common import (
    add_executor_flag,
    add_layout_flag,
    add_safety_flags,
    parse_size,
    safety_kwargs,
    show_progress,
    storage_options,
)


def run(args: argparse.Namespace) -> int:
    sizes = {
        k: v
        for k, v in (
            ("shard_bytes", args.shard_bytes),
            ("memory_bytes", args.memory_bytes),
            ("row_group_rows", args.row_group_rows),
        )
        if v is not None
    }
    report = convert(
        args.source,
        args.out,
        to=args.to,
        jobs=args.jobs,
        verify=args.verify,
        progress=show_progress(args),
        overwrite=args.overwrite,
        executor=args.executor,
        layout=args.layout,
        storage_options=storage_options(args),
        **sizes,
        **safety_kwargs(args),  # type: ignore[arg-type]
    )
    if args.json:
        summary = {
            "out": str(report.out),
            "to": report.to,
            "samples": report.num_samples,
            "parts": report.parts,
            "parts_reused": report.parts_reused,
            "already_done": report.already_done,
            "seconds": round(report.seconds, 3),
            "bytes_written": report.bytes_written,
            "verified": report.verified,
        }
        print(json.dumps(summary, indent=1))
        return 0
    verified = f"; verified {report.verified} samples" if report.verified is not None else ""
    if report.already_done:
        print(f"{report.out} is already a complete {report.to} conversion of this source{verified}")
    else:
        reused = f" ({report.parts_reused} reused from an interrupted run)"
        print(
            f"converted {report.num_samples} samples to {report.to} in {report.parts} parts"
            f"{reused if report.parts_reused else ''}, "
            f"{report.bytes_written / (1 << 20):.1f} MiB in {report.seconds:.2f} s{verified} "
            f"-> {report.out}"
        )
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("convert", help=COMMANDS["convert"])
    s.add_argument("source", help="directory, glob or pickle file")
    s.add_argument("out", help="output directory (complete or absent; rerun to resume)")
    s.add_argument(
        "--to",
        choices=available_formats(),
        default="memmap",
        help="the output format: a built-in one or one registered with "
        "pickleshard.formats.register_format in this process (default: memmap)",
    )
    s.add_argument(
        "--jobs", type=int, default=None, help="parts written at once (default: CPUs, max 8)"
    )
    s.add_argument(
        "--shard-bytes",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="WebDataset shard size, e.g. 256MiB (default 256MiB)",
    )
    s.add_argument(
        "--memory-bytes",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="read budget across all jobs, e.g. 1GiB (default 1GiB)",
    )
    s.add_argument(
        "--row-group-rows",
        type=int,
        default=None,
        metavar="N",
        help="parquet/arrow: rows per row group (default: about 1 MiB of data each)",
    )
    s.add_argument("--verify", action="store_true", help="read every sample back and compare")
    s.add_argument("--overwrite", action="store_true", help="replace an existing conversion")
    s.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    add_executor_flag(s)
    add_safety_flags(s)
    add_layout_flag(s)
    s.set_defaults(handler=run)
