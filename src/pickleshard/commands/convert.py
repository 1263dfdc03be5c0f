"""``pickleshard convert``: write a pickle dataset as memmap, LMDB, WebDataset, Parquet or Arrow."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from ..formats.registry import available_formats
from ..mixing import POLICIES
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


def parse_weights(text: str) -> list[float]:
    """``"0.7,0.3"`` -> proportions; ``"5000,2000"`` -> ints (absolute counts per epoch)."""
    try:
        values = [float(w) if any(c in w for c in ".eE") else int(w) for w in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not math.isfinite(w) or w < 0 for w in values) or not sum(values) > 0:
        raise argparse.ArgumentTypeError(
            f"expected numbers >= 0 with a positive sum, one per source, such as 0.7,0.3 "
            f"(proportions) or 5000,2000 (samples per epoch), got {text!r}"
        )
    return values


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _mix_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """convert's mix keywords from the flags; a usage error for flags that cannot apply."""
    sources = args.source
    if args.weights is None:
        if len(sources) > 1:
            args.parser.error(
                f"{len(sources)} sources given: mixing them needs --weights W1,...,W"
                f"{len(sources)} (one per source); to convert several files as one dataset, pass "
                "their directory or a quoted glob"
            )
        given = [
            flag
            for flag, value in (
                ("--epoch-size", args.epoch_size),
                ("--seed", args.seed),
                ("--when-exhausted", args.when_exhausted),
            )
            if value is not None
        ] + ["--tag"] * args.tag
        if given:
            args.parser.error(f"{', '.join(given)} apply to a mix: give --weights")
        return {}
    if len(args.weights) != len(sources):
        args.parser.error(
            f"{len(sources)} source(s) but {len(args.weights)} weights in --weights; give one "
            "per source, in order"
        )
    return {
        "weights": args.weights,
        "epoch_size": args.epoch_size,
        "policy": args.when_exhausted or "repeat",
        "seed": args.seed or 0,
        "tag": args.tag,
    }


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
    mix = _mix_kwargs(args)
    report = convert(
        args.source if mix else args.source[0],
        args.out,
        to=args.to,
        jobs=args.jobs,
        verify=args.verify,
        progress=show_progress(args),
        overwrite=args.overwrite,
        executor=args.executor,
        layout=args.layout,
        storage_options=storage_options(args),
        **mix,
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
    s.add_argument(
        "source",
        nargs="+",
        metavar="SRC",
        help="directory, glob or pickle file; several, with --weights, to write a mix of them "
        "(a folder holding a conversion mixes too)",
    )
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
    add_mix_flags(s)
    add_executor_flag(s)
    add_safety_flags(s)
    add_layout_flag(s)
    s.set_defaults(handler=run, parser=s)


def add_mix_flags(s: argparse.ArgumentParser) -> None:
    """The flags that make the output one epoch of a MixedDataset (docs/mixing.md)."""
    g = s.add_argument_group(
        "mixing several sources",
        "write one epoch of a weighted mix of the SRCs, in its shuffled order (docs/mixing.md)",
    )
    g.add_argument(
        "--weights",
        type=parse_weights,
        default=None,
        metavar="W1,W2,...",
        help="one per SRC: proportions (0.7,0.3) of --epoch-size, or, as whole numbers "
        "without --epoch-size, samples per epoch (5000,2000)",
    )
    g.add_argument(
        "--epoch-size",
        type=_positive,
        default=None,
        metavar="N",
        help="samples in the output (default: the sum of whole-number weights, or the "
        "sources' total size)",
    )
    g.add_argument("--seed", type=int, default=None, help="the mix's seed (default 0)")
    g.add_argument(
        "--when-exhausted",
        choices=POLICIES,
        default=None,
        help="what follows a source's last unused sample: another pass in a fresh order "
        "(repeat, the default), draws with replacement (resample) or an error (stop)",
    )
    g.add_argument(
        "--tag", action="store_true", help="add each sample's source index as a field 'source'"
    )
