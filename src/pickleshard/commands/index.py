"""``pickleshard index``: build the dataset index of a directory, glob or file of pickles."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ._common import add_safety_flags, policy_from_args, show_progress


def run(args: argparse.Namespace) -> int:
    from ..index import build_index

    t0 = time.perf_counter()
    idx = build_index(
        args.source,
        index=args.index,
        jobs=args.jobs,
        progress=show_progress(args),
        policy=policy_from_args(args),
        spans=not args.no_spans,
        skip_bad=args.skip_bad,
    )
    elapsed = time.perf_counter() - t0
    whole = [{"path": f.path, "reason": f.reason} for f in idx.files if f.mode == "whole"]
    skipped = [
        {"path": s["path"], "error": s["error"], "message": s["message"]} for s in idx.skipped
    ]
    summary: dict[str, Any] = {
        "index": str(idx.path),
        "files": len(idx.files),
        "samples": idx.num_samples,
        "fields": list(idx.fields),
        "layout": idx.header["layout"],
        "span_files": len(idx.files) - len(whole),
        "whole_files": whole,
        "skipped": skipped,
        "seconds": round(elapsed, 3),
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(
        f"indexed {summary['files']} files, {summary['samples']} samples "
        f"(fields {', '.join(summary['fields'])}; layout {', '.join(summary['layout'])}; "
        f"{summary['span_files']} read by span, {len(whole)} whole) "
        f"in {elapsed:.2f} s -> {summary['index']}"
    )
    for w in whole:
        print(f"  whole: {w['path']}: {w['reason']}")
    if skipped:
        print(f"skipped {len(skipped)} bad file(s):")
        for s in skipped:
            print(f"  {s['error']}: {s['message']}")
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("index", help="index a directory, glob or file of pickles")
    s.add_argument("source", help="directory, glob or pickle file")
    s.add_argument("--index", help="index directory (default: SOURCE/.pickleshard)")
    s.add_argument(
        "--jobs", type=int, default=None, help="files indexed at once (default: CPUs, max 8)"
    )
    s.add_argument(
        "--skip-bad",
        action="store_true",
        help="index every good file and list each bad one with its error (default: stop at the "
        "first bad file)",
    )
    s.add_argument(
        "--no-spans",
        action="store_true",
        help="unpickle every file whole to count its samples instead of scanning it for spans",
    )
    s.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    add_safety_flags(s)
    s.set_defaults(handler=run)
