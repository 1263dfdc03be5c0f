"""``python -m bench.suite.child prepare|row RESULT_JSON < SPEC_JSON``: one step, its own process.

A fresh process per step, so no row inherits another's heap, page cache state aside (which the
parent sets: files evicted for cold rows, read once for warm ones).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .plan import KINDS, DatasetSpec, RowSpec

__all__ = ["run_row"]


def run_row(spec: RowSpec) -> dict[str, Any]:
    """Open the row's loader and run one epoch; a loader that cannot run says why."""
    import torch  # noqa: F401 - imported before anything is measured, by every row

    from .epoch import read_bytes, run_epoch
    from .loaders import Unavailable, open_loader

    fetched0 = read_bytes()
    t0 = time.perf_counter()
    try:
        loader = open_loader(spec)
    except Unavailable as exc:
        return {"unavailable": str(exc)}
    open_s = time.perf_counter() - t0
    open_fetched = read_bytes() - fetched0
    stack = KINDS[spec.data.kind][0] == "arrays"
    m = run_epoch(
        loader,
        batch_size=spec.batch_size,
        workers=spec.workers,
        stack=stack,
        memory_interval=spec.memory_interval,
    )
    return {
        "open_s": open_s,
        "note": loader.note,
        "samples": m.samples,
        "first_batch_s": m.first_batch_s,
        "seconds": m.seconds,
        "start_pss": m.start_pss,
        "peak_pss": m.peak_pss,
        "pss_series": m.pss_series,
        "bytes_fetched": open_fetched + m.bytes_fetched,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("prepare", "row"):
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(sys.stdin.read())
    try:
        if argv[0] == "prepare":
            from .prepare import prepare

            try:
                result = prepare(DatasetSpec.from_json(spec["data"]), spec["key"])
            except ImportError as exc:
                result = {"unavailable": f"cannot import {exc.name}: {exc}"}
        else:
            result = run_row(RowSpec.from_json(spec))
    except Exception as exc:  # reported as the row's reason, not a crash of the whole suite
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
