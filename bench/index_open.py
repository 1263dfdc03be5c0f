"""``python -m bench index-open``: what validating an index on open costs (issue 12, item 2).

Builds (once, kept under ``--data``) a dataset of ``--files`` x ``--per-file`` small samples
(float32 ``(4,)`` arrays and int labels, ``pickleshard synth`` layout), indexes it, then times,
best of ``--repeat``, all from the page cache:

- *bare open*: what opening cost before validation: ``json.load`` of the header, one
  ``np.load(mmap_mode="r")`` per array, the files table as :class:`FileEntry` rows;
- *checked open*: :meth:`DatasetIndex.open` (header checks, each ``.npy`` opened and its
  CRC-32 computed, content checks);
- its parts: header checks, arrays mapped + checksums, content checks (vectorised numpy).

Writes ``bench/results/index-open[-quick|-Nfiles].md`` and ``.json``; never asserts a
speed. The default (100 files of 10,000) and ``--files 10000 --per-file 100`` (the same samples
in many small files: index.json is 11 MB, its per-file checks dominate) are the two published.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pickleshard.index import DatasetIndex, FileEntry
from pickleshard.index.arrays import expected_shapes, load_array
from pickleshard.index.contents import check_arrays
from pickleshard.index.ondisk import SAMPLES_DTYPE, SPAN_ARRAYS
from pickleshard.index.validate import check_header
from pickleshard.indexing.build import build_index
from pickleshard.pipelines.synth import write_synthetic

from .report import describe_machine, report_head, save_results
from .scan import best_of

__all__ = ["main"]

HERE = Path(__file__).resolve().parent


def _bare_open(where: Path) -> None:
    header = json.loads((where / "index.json").read_text())
    [FileEntry.from_json(f) for f in header["files"]]
    for name in header["arrays"].values():
        np.load(where / name, mmap_mode="r")


def _parts(where: Path) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
    header = json.loads((where / "index.json").read_text())
    files, _, checks = check_header(json.loads((where / "index.json").read_text()))
    nf = len(header["fields"])
    shapes = expected_shapes(files, nf)
    names, sums = header["arrays"], header["checksums"]

    def load() -> dict[str, np.ndarray]:
        return {
            n: load_array(
                where,
                names[n],
                SAMPLES_DTYPE if n == "samples" else np.dtype(np.int64),
                shapes[n],
                sums[n],
            )
            for n in ("samples", *SPAN_ARRAYS)
        }

    arrays = load()
    return (
        lambda: check_header(json.loads((where / "index.json").read_text())),
        load,
        lambda: check_arrays(files, checks, nf, arrays, names),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench index-open", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--per-file", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--data", type=Path, default=Path("/tmp/pickleshard-bench-index-open"))
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--quick", action="store_true", help="a smoke run: 4 files of 1,000")
    args = p.parse_args(argv)
    if args.quick:
        args.files, args.per_file, args.repeat = 4, 1000, 3
    folder = args.data / f"{args.files}x{args.per_file}"
    if not (folder / ".pickleshard" / "index.json").exists():
        write_synthetic(folder, files=args.files, per_file=args.per_file, shape=(4,))
        build_index(folder, jobs=1)
    where = folder / ".pickleshard"
    index = DatasetIndex.open(where)
    nbytes = sum((where / n).stat().st_size for n in index.header["arrays"].values())
    header_bytes = (where / "index.json").stat().st_size
    head, load, content = _parts(where)
    rows = {
        "bare open (json + np.load mmap, no checks)": best_of(
            lambda: _bare_open(where), args.repeat
        ),
        "checked open (DatasetIndex.open)": best_of(lambda: DatasetIndex.open(where), args.repeat),
        "  header checks (index.json)": best_of(head, args.repeat),
        "  arrays mapped + CRC-32": best_of(load, args.repeat),
        "  content checks": best_of(content, args.repeat),
    }
    machine = describe_machine(
        shlex.join([sys.executable, "-m", "bench", "index-open", *(argv or [])])
    )
    lines = report_head("Index open: the cost of validating an untrusted index", machine)
    lines += [
        "",
        f"{len(index):,} samples in {len(index.files)} files, {len(index.fields)} fields; "
        f"arrays {nbytes / 1e6:.1f} MB, index.json {header_bytes / 1e3:.0f} KB; best of "
        f"{args.repeat}, page cache warm.",
        "",
        "| step | ms |",
        "|---|---:|",
        *[f"| {k} | {v * 1e3:.1f} |" for k, v in rows.items()],
    ]
    raw = {
        "samples": len(index),
        "files": len(index.files),
        "array_bytes": nbytes,
        "seconds": rows,
        "machine": machine,
    }
    name = "index-open" + (
        "-quick" if args.quick else "" if args.files == 100 else f"-{args.files}files"
    )
    save_results(args.out, name, lines, raw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
