"""``pickleshard index``: build the dataset index of a directory, glob or file of pickles."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ._common import add_safety_flags, policy_from_args


def run(args: argparse.Namespace) -> int:
    from ..index import build_index

    t0 = time.perf_counter()
    idx = build_index(
        args.source,
        index=args.index,
        jobs=args.jobs,
        progress=not args.json,
        policy=policy_from_args(args),
    )
    elapsed = time.perf_counter() - t0
    summary: dict[str, Any] = {
        "index": str(idx.path),
        "files": len(idx.files),
        "samples": idx.num_samples,
        "fields": list(idx.fields),
        "layout": idx.header["layout"],
        "seconds": round(elapsed, 3),
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"indexed {summary['files']} files, {summary['samples']} samples "
            f"(fields {', '.join(summary['fields'])}; layout {', '.join(summary['layout'])}) "
            f"in {elapsed:.2f} s -> {summary['index']}"
        )
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("index", help="index a directory, glob or file of pickles")
    s.add_argument("source", help="directory, glob or pickle file")
    s.add_argument("--index", help="index directory (default: SOURCE/.pickleshard)")
    s.add_argument(
        "--jobs", type=int, default=None, help="files decoded at once (default: CPUs, max 8)"
    )
    s.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    add_safety_flags(s)
    s.set_defaults(handler=run)
