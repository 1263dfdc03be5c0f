"""``pickleshard index``: build the dataset index of a directory, glob or file of pickles.

The summary says what the scans examined (``bytes_examined``) and what storage delivered to
the scanning processes (``bytes_fetched``, ``read_bytes`` of ``/proc/self/io`` around each
file's scan: the index may be built in worker processes, each measures its own). For remote
objects ``bytes_fetched`` is what the requests returned, and ``requests`` and
``requests_per_sample`` are added; ``seconds`` is the build's wall time (the index itself keeps
counts only: two builds of the same files write the same index).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from ..indexing.build import build_index
from . import COMMANDS
from ._common import (
    add_executor_flag,
    add_layout_flag,
    add_safety_flags,
    layout_words,
    policy_from_args,
    show_progress,
    storage_options,
)


def run(args: argparse.Namespace) -> int:

    t0 = time.perf_counter()
    idx = build_index(
        args.source,
        index=args.index,
        jobs=args.jobs,
        progress=show_progress(args),
        policy=policy_from_args(args),
        layout=args.layout,
        spans=not args.no_spans,
        skip_bad=args.skip_bad,
        executor=args.executor,
        storage_options=storage_options(args),
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
        **_reads(idx.files),
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(
        f"indexed {summary['files']} files, {summary['samples']} samples "
        f"(fields {', '.join(summary['fields'])}; "
        f"layout {', '.join(layout_words(name) for name in summary['layout'])}; "
        f"{summary['span_files']} read by span, {len(whole)} whole) "
        f"in {elapsed:.2f} s -> {summary['index']}"
    )
    if summary["span_bytes"]:
        fetched = summary["bytes_fetched"]
        pct = 100 / summary["span_bytes"]
        print(
            f"  scans examined {summary['bytes_examined']:,} bytes "
            f"({pct * summary['bytes_examined']:.2f}% of the span files)"
            + ("" if fetched is None else f", fetched {fetched:,} ({pct * fetched:.2f}%)")
        )
    for w in whole:
        print(f"  whole: {w['path']}: {w['reason']}")
    if skipped:
        print(f"skipped {len(skipped)} bad file(s):")
        for s in skipped:
            print(f"  {s['error']}: {s['message']}")
    return 0


def _reads(files: Sequence[Any]) -> dict[str, Any]:
    """What the scans of the span files examined and what storage delivered to the processes
    that scanned them (each measured around its own scan; None when a file's count is missing:
    no ``/proc/self/io``, or an index built before it was recorded). Whole files are unpickled,
    every byte read; their bytes are ``whole_bytes``."""
    scans = [f.scan for f in files if f.mode == "span" and f.scan is not None]
    fetched = [s.get("bytes_fetched") for s in scans]
    requests = [s.get("requests") for s in scans]  # remote objects: requests made, their wait
    remote = (
        {}
        if None in requests or not scans
        else {
            "requests": sum(int(r) for r in requests),
            "requests_per_sample": round(
                sum(int(r) for r in requests)
                / max(1, sum(f.num_samples for f in files if f.mode == "span")),
                5,
            ),
        }
    )
    return {
        **remote,
        "span_bytes": sum(int(s["size"]) for s in scans),
        "bytes_examined": sum(int(s["bytes_read"]) for s in scans),
        "bytes_fetched": None if None in fetched else sum(int(f) for f in fetched),
        "whole_bytes": sum(f.size for f in files if f.mode == "whole"),
    }


def register(sub: Any) -> None:
    s = sub.add_parser("index", help=COMMANDS["index"])
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
    add_executor_flag(s)
    add_safety_flags(s)
    add_layout_flag(s)
    s.set_defaults(handler=run)
