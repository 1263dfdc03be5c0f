"""``python -m bench``: whole-file PickleDataset against the naive and folk baselines.

``python -m bench scan ...`` runs ``bench.scan`` instead (index build: scanner vs unpickling),
``python -m bench compressed ...`` runs ``bench.compressed`` (compressed pickles read in place),
``python -m bench span ...`` runs ``bench.span`` (shuffled epochs by span vs numpy memmap),
``python -m bench batch ...`` runs ``bench.batch`` (a shuffled batch read and collated, every way),
``python -m bench convert-formats ...`` runs ``bench.convert_formats`` (Lance, ArrayRecord vs Parquet),
``python -m bench mix ...`` runs ``bench.mix`` (a MixedDataset of two sources vs one dataset),
``python -m bench remote ...`` runs ``bench.remote`` (a shuffled epoch from S3 by byte range),
``python -m bench open ...`` runs ``bench.open`` (a first open against ``pickle.load``),
``python -m bench index-open ...`` runs ``bench.index_open`` (the cost of validating an index),
``python -m bench first-epoch ...`` runs ``bench.first_epoch`` (whole-file first epoch vs folk),
``python -m bench --suite full|quick`` runs ``bench.suite`` (every loader side by side),
``python -m bench executors ...`` runs ``bench.executors`` (index/convert/verify: local vs Dask).

Rows: {null, naive list, folk JSON, PickleDataset + BlockShuffleSampler} x {sequential,
shuffled} x the ``--workers`` counts, each in a fresh process through the same DataLoader loop.
Prints a Markdown table and writes it, with the raw numbers as JSON, to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from .data import DataSpec, ensure_data
from .measure import MiB
from .plot import write_plot
from .report import (
    TITLE,
    describe_machine,
    load_results,
    markdown_report,
    results_json,
    table,
)
from .runner import Kind, Order, RowResult, RowSpec, run_isolated

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
KINDS: tuple[Kind, ...] = ("null", "naive", "folk", "pickleshard", "span")
ORDERS: tuple[Order, ...] = ("sequential", "shuffled")
QUICK = {"files": 4, "per_file": 250, "cache_mib": 8, "folk_shuffle_cap": 64}


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def _kinds(text: str) -> tuple[Kind, ...]:
    chosen = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"datasets are {', '.join(KINDS)}; got {text!r}")
    return tuple(k for k in KINDS if k in chosen)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__, allow_abbrev=False)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--per-file", type=int, default=5000)
    p.add_argument("--shape", type=_ints, default=(3, 32, 32), help="sample shape, e.g. 3,32,32")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=_ints, default=(0, 2), help="DataLoader num_workers, e.g. 0,2")
    p.add_argument("--cache-bytes", type=int, default=256 * MiB, help="whole-file cache budget")
    p.add_argument(
        "--folk-shuffle-cap", type=int, default=2048, help="samples in the folk shuffled run"
    )
    p.add_argument(
        "--gc-freeze",
        action="store_true",
        help="call gc.freeze() in each row's process before its epoch (not what users do)",
    )
    p.add_argument("--datasets", type=_kinds, default=KINDS, help=f"subset of {','.join(KINDS)}")
    p.add_argument("--data", type=Path, default=HERE / "data", help="where synthetic data is kept")
    p.add_argument("--out", type=Path, default=HERE / "results", help="where results are written")
    p.add_argument("--name", default="whole-file-vs-baselines", help="results file stem")
    p.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="measure nothing: rebuild the .md and .png beside a results JSON written before",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK['files']} files x {QUICK['per_file']}, "
        f"{QUICK['cache_mib']} MiB cache, folk cap {QUICK['folk_shuffle_cap']}; writes NAME-quick.*",
    )
    return p


def _plan(args: argparse.Namespace, data: DataSpec) -> list[RowSpec]:
    rows = []
    for workers in args.workers:
        for kind in args.datasets:
            for order in ORDERS[:1] if kind == "null" else ORDERS:
                rows.append(
                    RowSpec(
                        kind=kind,
                        order=order,
                        workers=workers,
                        data_root=str(data.root),
                        files=data.files,
                        per_file=data.per_file,
                        shape=data.shape,
                        batch_size=args.batch_size,
                        cache_bytes=args.cache_bytes,
                        folk_shuffle_cap=args.folk_shuffle_cap,
                        seed=data.seed,
                        gc_freeze=args.gc_freeze,
                    )
                )
    return rows


def _setup(args: argparse.Namespace, data: DataSpec) -> dict[str, str]:
    size = sum(p.stat().st_size for p in data.paths)
    dims = "x".join(str(d) for d in data.shape)
    return {
        "data": f"{data.num_samples:,} float32 ({dims}) samples + int labels in {data.files} files "
        f"of `pickle.dump((x_list, y_list))`, {size / MiB:,.0f} MiB on disk, read from the "
        "page cache (written or reused before the first row)",
        "loop": f"`DataLoader(ds, batch_size={args.batch_size}, sampler=..., num_workers=W)`, "
        "default collate, each batch consumed as `float(xb.float().sum())`; one run per row, each "
        "row in a fresh Python process",
        "cache budget": f"{args.cache_bytes / MiB:,.0f} MiB in total across workers "
        "(PickleDataset and BlockShuffleSampler)",
        "shuffled": "`RandomSampler` (what `shuffle=True` builds) for the baselines and the "
        f"span row, its first {args.folk_shuffle_cap:,} indices for the folk row (capped); "
        "BlockShuffleSampler for whole-file PickleDataset (sequential = `shuffle=False`)",
        "index s": "naive: unpickling every file into the list; folk: unpickling every file to "
        "count samples and writing the JSON, then `json.load`; whole-file PickleDataset: "
        "`build_index(spans=False)` after deleting `.pickleshard/`. Each of these unpickles every "
        "file once, not counted in file loads. Span PickleDataset: `build_index` (the opcode "
        "scanner, no file unpickled)",
        "seconds": "from creating the DataLoader iterator (worker start included) to the last batch",
        "PSS": "summed over the row's process and all its descendants (DataLoader workers), "
        "sampled every 50 ms during the epoch; 'before epoch' is the first sample, 'growth' the "
        "peak minus it. Shared library pages (libtorch) are divided among *every* process on the "
        "machine that maps them, so other Python+torch processes running at the same time lower "
        "the absolute figures (by up to ~70 MiB on this machine); growth is less sensitive",
        "peak alone": "the same samples, summed as RSS of the row's process + USS (private pages) "
        "of its workers: what the tree would cost alone on the machine, whatever else runs",
        "gc": "`gc.freeze()` called before each epoch (--gc-freeze)"
        if args.gc_freeze
        else "default (no `gc.freeze()`)",
        "file loads": "files unpickled during the epoch, summed over the main process and "
        "workers (each process reports its own counter: PickleDataset `cache_stats.loads`)",
    }


def _measure(args: argparse.Namespace, command: str) -> dict[str, Any]:
    machine = describe_machine(command)
    data = DataSpec(args.data, args.files, args.per_file, tuple(args.shape))
    t0 = time.perf_counter()
    if ensure_data(data):
        print(f"wrote {data.directory} in {time.perf_counter() - t0:.1f} s", flush=True)
    else:
        print(f"reusing {data.directory}", flush=True)
    rows: list[RowResult] = []
    for spec in _plan(args, data):
        print(f"-- {spec.kind} {spec.order} workers={spec.workers}", flush=True)
        row = run_isolated(spec)
        print(
            f"   {row.samples:,} samples in {row.seconds:.2f} s = {row.samples_per_s:,.0f}/s, "
            f"peak PSS {row.peak_pss / MiB:,.0f} MiB, {row.file_loads} file loads",
            flush=True,
        )
        rows.append(row)
    machine["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"measured {len(rows)} rows in {time.perf_counter() - t0:.0f} s")
    return results_json(TITLE, machine, _setup(args, data), rows)


def _write_report(raw: dict[str, Any], out: Path, name: str) -> None:
    """Print the results table; write the whole report (machine, setup, table, ratios) with its
    PNG (when matplotlib is there) to ``out``."""
    title, machine, setup, rows = load_results(raw)
    cache_bytes = rows[0].spec.cache_bytes if rows else 0
    report = markdown_report(title, machine, setup, rows, cache_bytes)
    print()
    print(table(rows))
    out.mkdir(parents=True, exist_ok=True)
    if write_plot(rows, out / f"{name}.png", title):
        report += f"\n![samples/s and peak PSS per row]({name}.png)\n"
    (out / f"{name}.md").write_text(report)
    print(f"\nthe setup, the machine and the ratios: {out / name}.md (raw numbers: .json)")


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]  # `pickleshard bench -- --quick` passes its separator through
    given = sys.argv[1:] if argv is None else argv
    if any(a == "--suite" or a.startswith("--suite=") for a in given):  # the loader suite
        from .suite.main import main as suite_main

        return suite_main(given)
    if given[:1] == ["open"]:  # `python -m bench open ...`
        from .open import main as open_main

        return open_main(given[1:])
    if given[:1] == ["index-open"]:  # `python -m bench index-open ...`
        from .index_open import main as index_open_main

        return index_open_main(given[1:])
    if given[:1] == ["scan"]:  # `python -m bench scan ...`
        from .scan import main as scan_main

        return scan_main(given[1:])
    if given[:1] == ["first-epoch"]:  # `python -m bench first-epoch ...`
        from .first_epoch import main as first_epoch_main

        return first_epoch_main(given[1:])
    if given[:1] == ["executors"]:  # `python -m bench executors ...`
        from .executors import main as executors_main

        return executors_main(given[1:])
    if given[:1] == ["remote"]:  # `python -m bench remote ...`
        from .remote import main as remote_main

        return remote_main(given[1:])
    if given[:1] == ["compressed"]:  # `python -m bench compressed ...`
        from .compressed import main as compressed_main

        return compressed_main(given[1:])
    if given[:1] == ["batch"]:  # `python -m bench batch ...`
        from .batch import main as batch_main

        return batch_main(given[1:])
    if given[:1] == ["convert-formats"]:  # `python -m bench convert-formats ...`
        from .convert_formats import main as convert_formats_main

        return convert_formats_main(given[1:])
    if given[:1] == ["mix"]:  # `python -m bench mix ...`
        from .mix import main as mix_main

        return mix_main(given[1:])
    if given[:1] == ["span"]:  # `python -m bench span ...`
        from .span import main as span_main

        return span_main(given[1:])
    args = _parser().parse_args(argv)
    if args.render is not None:
        raw = json.loads(args.render.read_text())
        _write_report(raw, args.render.parent, args.render.stem)
        return 0
    if args.quick:
        args.files, args.per_file = QUICK["files"], QUICK["per_file"]
        args.cache_bytes = QUICK["cache_mib"] * MiB
        args.folk_shuffle_cap = QUICK["folk_shuffle_cap"]
        args.name += "-quick"
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    raw = _measure(args, command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(raw, indent=1) + "\n")
    _write_report(raw, args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
